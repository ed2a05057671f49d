"""What a worker's other threads cost its model thread (issue 32): the tiny model's
forward_records over real packed batches, alone and with one other thread running beside it
without pause: the store's write of a batch, the input's read of a batch, a numpy sort (C code
that releases the GIL) or a pure-Python loop. Prints the model's ns/position in each case.

    python benchmarks/bench_gil.py [--model DIR] [--input FASTA] [--rounds 3]

A D=8 model's forward is bound by Python dispatch: it takes the GIL back after every small
torch op, so a thread beside it that holds the GIL in Python (zarr's event loop, per-record
reading) slows it, and one that runs C code with the GIL released does not. Default input:
bench-out/packed_20k.fa (benchmarks/bench_pipeline.py makes it from ../shared/data); default
model: `linpipe model init DIR --d-model 8 --n-heads 1 --n-layers 1 --mlp-hidden 8 --conv-width 1`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_host_path import REPO, worker_job  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a model folder (default: a tiny D=8 model)")
    ap.add_argument("--input", type=Path, default=REPO / "bench-out" / "packed_20k.fa")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = args.model
        if model is None:
            from linpipe.model import ModelConfig, init_net, save_model

            cfg = ModelConfig(modality="dna", d_model=8, n_layers=1, n_heads=1, mlp_hidden=8, conv_width=1)
            save_model(init_net(cfg, seed=0), cfg, Path(d) / "tiny8")
            model = str(Path(d) / "tiny8")
        plan, w, _ = worker_job(args.input, model, Path(d) / "out.zarr")
        inp = w._input(str(args.input))
        batches = [[w._read(u, inp)[0] for u in plan.batch_units(b)]
                   for b in range(min(10, plan.packed.n_batches))]
        n = sum(len(x) for xs in batches for x in xs)
        outs = w.model.forward_records(batches[0], outputs=w.outputs)
        arrays = {name: np.concatenate([o[name] for o in outs]) for name in outs[0]}
        units = plan.batch_units(0)
        big = np.random.default_rng(0).random(4_000_000)
        stop = threading.Event()
        beside = {
            "alone": None,
            "store write": lambda: w.store.write_batch(0, arrays),
            "input read": lambda: [w._read(u, inp) for u in units],
            "numpy sort": lambda: np.sort(big),
            "pure Python": lambda: sum(i * i for i in range(10_000)),
        }

        def model_ns() -> float:
            t0 = time.perf_counter()
            for xs in batches:
                w.model.forward_records(xs, outputs=w.outputs)
            return (time.perf_counter() - t0) / n * 1e9

        for name, work in beside.items():
            def loop(work=work):
                while not stop.is_set():
                    work()
            stop.clear()
            th = threading.Thread(target=loop) if work else None
            if th:
                th.start()
                time.sleep(0.1)
            times = sorted(model_ns() for _ in range(args.rounds if name != "pure Python" else 1))
            stop.set()
            if th:
                th.join()
            print(f"{name:>12}: model {times[len(times) // 2]:8.0f} ns/position (median of {len(times)}; "
                  f"{n:,} positions in {len(batches)} batches)", flush=True)
        w.close()


if __name__ == "__main__":
    main()
