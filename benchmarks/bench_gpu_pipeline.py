"""End to end on a GPU (../shared/gpu/README.md, item 4): a model over a genome of 100+ Mb
through the worker path (inputs, plan, the model on the device, the overlap, the store's
writes, checksums, boundary states, markers), against the bare model's forward over the same
units on the same device. Prints positions/s of each and their ratio, the worker's read /
wait / model / write split, the GPU's busy fraction (sampled from NVML or nvidia-smi while the
worker runs) and the model thread's, and whether the stored outputs equal the bare forward's.

    python benchmarks/bench_gpu_pipeline.py [--mb 100] [--model default] [--device cuda]
    python benchmarks/bench_gpu_pipeline.py --input small.fa --device cpu --unit 4096  (the test)

Without --input, the input is the real genomes in ../shared/data (LINPIPE_SHARED_DATA) joined
(about 7.8 Mb) and tiled as records until it holds --mb Mb. One PipelineWorker in this process
(the actor's code, no Ray), its calls overlapped as the driver and Ray run them (IN_FLIGHT at
once). The bare forward runs the same units, read beforehand, state carried unit to unit
(packed records through forward_records), and its outputs come back to the host as numpy
arrays, as the worker's do. Rounds alternate bare and worker; medians are printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_host_path import REPO, _sequence, _write, overlapped, worker_job  # noqa: E402


def _genome(folder: Path, mb: float) -> Path:
    seq = _sequence()
    n = max(1, -(-int(mb * 1e6) // len(seq)))
    path = folder / f"tiled_{mb:g}Mb.fa"
    _write(path, {f"tile{i}": seq for i in range(n)})
    return path


class BusySampler:
    """The GPU's utilisation (% of time a kernel ran), sampled every `every` s in a thread:
    NVML through torch.cuda.utilization, else nvidia-smi. None where neither answers."""

    def __init__(self, device, every: float = 0.1):
        self.device, self.every = device, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> float | None:
        import torch

        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:
            pass
        try:
            idx = self.device.index or 0
            got = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu",
                                  "--format=csv,noheader,nounits", "-i", str(idx)],
                                 capture_output=True, text=True, timeout=5)
            return float(got.stdout.strip())
        except Exception:
            return None

    def _run(self):
        while not self._stop.wait(self.every):
            v = self._sample()
            if v is None:
                return
            self.samples.append(v)

    def __enter__(self):
        if self.device.type == "cuda":
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def busy(self) -> float | None:
        return statistics.mean(self.samples) / 100 if self.samples else None


class ThreadUsage:
    """What the model's calls cost the thread that ran them, summed (Linux's per-thread rusage):
    CPU seconds, seconds off the CPU inside a call (waiting for the GIL, mostly), voluntary
    context switches (each a wait) and page faults. Wraps a Model's forward and forward_records."""

    def __init__(self, model):
        self.sums = np.zeros(5)  # wall, cpu, waits, switches, faults
        for name in ("forward", "forward_records"):  # the class's method: one wrapper per round
            setattr(model, name, self._timed(getattr(type(model), name).__get__(model)))

    def _timed(self, fn):
        import resource

        def call(*args, **kw):
            u0, c0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time(), time.perf_counter()
            out = fn(*args, **kw)
            u1, c1, t1 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time(), time.perf_counter()
            self.sums += (t1 - t0, c1 - c0, (t1 - t0) - (c1 - c0), u1.ru_nvcsw - u0.ru_nvcsw,
                          u1.ru_minflt - u0.ru_minflt)
            return out
        return call

    def line(self) -> str:
        wall, cpu, waits, switches, faults = self.sums
        return f"cpu {cpu:.2f} s, off the CPU {waits:.2f} s, {switches:,.0f} waits, {faults:,.0f} page faults"


def _bare(model, units, calls, outputs):
    """The model's forward over the worker's units: (seconds, outputs per call)."""
    import torch

    outs, state, key = [], None, None
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for (name, args, _kw), x in zip(calls, units, strict=True):
        if name == "run_batch":
            outs.append(model.forward_records(x, outputs=outputs))
            continue
        if args[0].key != key:
            key, state = args[0].key, model.init_state()
        out, state = model.forward(x, state, outputs=outputs)
        outs.append(out)
    sync()
    return time.perf_counter() - t0, outs


def _same(store_path: Path, calls, bare_outs) -> float:
    """The largest |stored - bare| over every output of every unit (0.0: bit for bit)."""
    import linpipe

    res = linpipe.open_output(str(store_path))
    names = sorted({k for out in bare_outs for o in (out if isinstance(out, list) else [out]) for k in o})
    # every stored unit, read once through the store's own checked reader (a packed batch once)
    stored = {(info.id, start): values for info, start, values in res.units(names)}
    worst = 0.0
    for (name, args, _kw), out in zip(calls, bare_outs, strict=True):
        if name == "run_batch":
            pairs = [(u.record_id, 0, o) for u, o in zip(args[1], out, strict=True)]
        else:
            pairs = [(args[0].record_id, args[0].start, out)]
        for rid, a, o in pairs:
            for k, v in o.items():
                got = np.asarray(stored[rid, a][k], dtype=np.float64)
                worst = max(worst, float(np.max(np.abs(got - np.asarray(v, dtype=np.float64)), initial=0.0)))
    return worst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, help="a FASTA to run (default: the shared genomes tiled to --mb)")
    ap.add_argument("--mb", type=float, default=100.0, help="Mb of tiled genome without --input")
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default=None, help="cuda when there is one, else cpu")
    ap.add_argument("--unit", type=int, default=1 << 20, help="positions per unit (the job's unit size)")
    ap.add_argument("--outputs", default="logprob,entropy")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the actor's default)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    import linpipe

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    outputs = tuple(args.outputs.split(","))
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "none"
    try:
        import triton
        tri = triton.__version__
    except ImportError:
        tri = "none"
    print(f"device {device} ({gpu}), torch {torch.__version__}, triton {tri}, linpipe {linpipe.__version__}, "
          f"model {args.model}, unit {args.unit:,}, outputs {args.outputs}, {args.threads} torch thread(s)")
    bench_out = REPO / "bench-out"
    with tempfile.TemporaryDirectory(dir=bench_out if bench_out.is_dir() else None) as d:
        d = Path(d)
        fasta = args.input or _genome(d, args.mb)
        def job():
            return worker_job(fasta, args.model, d / "out.zarr", outputs, args.unit, device, args.threads)

        plan, w, calls = job()
        inputs = {}
        units = []
        for name, a, _kw in calls:  # the bare forward's input, read beforehand
            if name == "run_batch":
                units.append([w._read(u, inputs.setdefault(u.input_path, w._input(u.input_path)))[0]
                              for u in a[1]])
            else:
                units.append(w._read(a[0])[0])
        w.close()
        model = linpipe.load_model(plan.model_ref, device=device)
        n = plan.total_positions
        print(f"input {fasta.name}: {len(plan.records):,} long and {len(plan.packed.ids):,} packed records, "
              f"{n:,} positions, {len(calls):,} calls")
        bare_s, piped_s, busy, split, model_busy = [], [], [], None, []
        worst = None
        threads = hasattr(__import__("resource"), "RUSAGE_THREAD")  # Linux
        usage = {"bare": [], "worker": []}
        for r in range(args.rounds):
            if threads:
                usage["bare"].append(ThreadUsage(model))
            t, outs = _bare(model, units, calls, outputs)
            bare_s.append(t)
            plan, w, calls = job()
            if threads:
                usage["worker"].append(ThreadUsage(w.model))
            with BusySampler(w.model.device) as sampler:
                t0 = time.perf_counter()
                res = overlapped(w, calls)
                wall = time.perf_counter() - t0
            w.close()
            piped_s.append(wall)
            busy.append(sampler.busy)
            model_busy.append(sum(x.model_s for x in res) / wall)
            split = [sum(getattr(x, k) for x in res) * 1e9 / n
                     for k in ("read_s", "wait_s", "model_s", "write_s")]
            if r == 0:
                worst = _same(d / "out.zarr", calls, outs)
        bare, piped = n / statistics.median(bare_s), n / statistics.median(piped_s)
        rd, wt, md, wr = split
        gpu_busy = [b for b in busy if b is not None]
        print(f"bare forward: {bare / 1e6:.3f} M positions/s; worker path: {piped / 1e6:.3f} M positions/s "
              f"= {piped / bare:.3f}x the bare forward (medians of {args.rounds} round(s))")
        print(f"worker split per position: read {rd:.1f} ns, wait {wt:.1f}, model {md:.1f}, write {wr:.1f}; "
              f"model thread busy {statistics.median(model_busy):.0%} of the wall time; GPU busy "
              + (f"{statistics.median(gpu_busy):.0%}" if gpu_busy else "n/a (no GPU sampled)"))
        if threads:  # the model's thread, summed over the calls of the round of median worker time
            r = piped_s.index(sorted(piped_s)[len(piped_s) // 2])
            print(f"model thread: bare {usage['bare'][r].line()}; worker {usage['worker'][r].line()}")
        print(f"stored outputs vs the bare forward's: largest difference {worst:.3g}")


if __name__ == "__main__":
    main()
