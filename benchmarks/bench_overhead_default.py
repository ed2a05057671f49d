"""Pipeline overhead with the shipped default model (issue 6): bare Model.forward over the
4.7 Mb real-genome input in one process (1 torch thread, chunks of 262,144, logprob+entropy)
vs `linpipe submit --workers 1` on the same file, alternated twice in one run.

    python benchmarks/bench_pipeline.py overhead   # once, to build bench-out/real_4mb.fa
    python benchmarks/bench_overhead_default.py
"""
import subprocess
import time

import torch

import linpipe

torch.set_num_threads(1)
PATH = "bench-out/real_4mb.fa"
UNIT = 262144


def bare():
    m = linpipe.load_model("default")
    inp = linpipe.open_input(PATH)
    t = time.perf_counter()
    n = 0
    for r in inp.records:
        st = m.init_state()
        for s in range(0, r.length, UNIT):
            tok, _mask = inp.read(r.id, s, min(r.length, s + UNIT))
            _out, st = m.forward(tok, st, outputs=["logprob", "entropy"])
            n += len(tok)
    return time.perf_counter() - t, n


def submit():
    subprocess.run(["rm", "-rf", "/tmp/o1.zarr"])
    t = time.perf_counter()
    r = subprocess.run(["linpipe", "submit", PATH, "--out", "/tmp/o1.zarr", "--workers", "1"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    done = [ln for ln in r.stdout.splitlines() + r.stderr.splitlines() if ln.startswith("Done:")][0]
    return wall, done


for rnd in (1, 2):
    b, n = bare()
    w, line = submit()
    print(f"round {rnd}: bare {b:.1f} s ({n} positions); submit wall {w:.1f} s; {line}")
