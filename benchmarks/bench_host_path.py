"""The worker's host path alone: reading, the store's write path (compression, checksums,
boundary states, markers, fsync) and the overlap, with a stand-in model that costs nothing
(or sleeps a set time per unit). Figures go to BENCHMARKS.md.

    python benchmarks/bench_host_path.py [--records 100000] [--sleep-ms 0] [--rounds 3]
        [--cases logprob,entropy+softmask,hidden,series] [--long-mb 32]

One PipelineWorker in this process (the actor's own code, no Ray), on a long record of --long-mb
million positions (the real genomes in ../shared/data (LINPIPE_SHARED_DATA), about 8 Mb joined,
repeated) and on --records packed records of 80-600 bp cut from the 8 Mb. Cases (--cases,
joined by commas): `logprob` writes logprob,entropy; `softmask` adds the soft-mask; `hidden`
writes float16 hidden states of a 64-wide model (the default model's width); `series` is a
time-series job (forecast, residual) over the real 2-lead MIT-BIH 100 ECG tiled to --long-mb
million samples, and --records series of 80-600 samples cut from it (one Parquet file with an
id column). Each round runs the calls one by one (as before the overlap) and then overlapped
(IN_FLIGHT calls numbered as the driver numbers them, in threads as Ray runs them),
alternating; the median of each is printed.
The stand-in model returns a small model's real outputs over the input's first unit (so the
codec sees real values), sliced to each unit's length.
The long inputs are long enough for the rate to be the steady state's: a worker's first call
costs more than the others (its writing process's first write, 20-40 ms more on a 2-core VM;
here also the wait for that process's start, which a real worker's model load covers), which
over the 30 calls of 8 Mb was a tenth of the run; that call's time is printed apart.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data"))
DATA = SHARED / "genomes"
GENOMES = ("korflab_hg19_chr1_first3Mb.fa.gz", "abricate_Sepidermidis_ST14_assembly.fa",
           "korflab_Athaliana_TAIR_1pct.fa", "htslib_ce.fa")
UNIT = 262_144


def _sequence() -> str:
    import gzip

    parts = []
    for name in GENOMES:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(DATA / name, "rt") as f:
            parts += [line.strip() for line in f if not line.startswith(">")]
    return "".join(parts)


def _write(path: Path, records: dict[str, str]) -> None:
    with open(path, "w") as f:
        for rid, seq in records.items():
            f.write(f">{rid}\n")
            for i in range(0, len(seq), 80):
                f.write(seq[i:i + 80] + "\n")


def _inputs(folder: Path, n_records: int, long_mb: float) -> dict[str, Path]:
    seq = _sequence()
    rng = np.random.default_rng(0)
    long, packed = folder / "long.fa", folder / "packed.fa"
    _write(long, {"joined": (seq * -(-int(long_mb * 1e6) // len(seq)))[:int(long_mb * 1e6)]})
    records = {}
    for i in range(n_records):
        n = int(rng.integers(80, 601))
        s = int(rng.integers(0, len(seq) - n))
        records[f"read{i}"] = seq[s:s + n]
    _write(packed, records)
    return {"long record": long, f"{n_records:,} packed records": packed}


def _series_inputs(folder: Path, n_records: int, long_mb: float) -> dict[str, tuple[Path, dict]]:
    """The ECG tiled to long_mb million samples (one series), and n_records series of 80-600
    samples cut from it in one file with an id column; (path, input options) by label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ecg = pq.read_table(SHARED / "timeseries" / "mitdb_100_ecg.parquet").select(list(CHANNELS))
    x = np.column_stack([ecg.column(c).to_numpy().astype(np.float32) for c in CHANNELS])
    long = np.resize(x, (int(long_mb * 1e6), len(CHANNELS)))
    pq.write_table(pa.table({c: long[:, i] for i, c in enumerate(CHANNELS)}), folder / "series.parquet")
    rng = np.random.default_rng(0)
    parts, ids = [], []
    for i in range(n_records):
        n = int(rng.integers(80, 601))
        s = int(rng.integers(0, len(x) - n))
        parts.append(x[s:s + n])
        ids.append(np.full(n, i, dtype=np.int64))
    short, sid = np.concatenate(parts), np.concatenate(ids)
    pq.write_table(pa.table({"id": sid.astype(str)} | {c: short[:, i] for i, c in enumerate(CHANNELS)}),
                   folder / "short_series.parquet")
    return {"long series": (folder / "series.parquet", {}),
            f"{n_records:,} short series": (folder / "short_series.parquet", {"id_column": "id"})}


CHANNELS = ("MLII_mV", "V5_mV")
CASES = {  # name: (outputs, model config keywords)
    "logprob": (("logprob", "entropy"), {"modality": "dna", "d_model": 8}),
    "softmask": (("logprob", "entropy", "softmask"), {"modality": "dna", "d_model": 8}),
    "hidden": (("hidden",), {"modality": "dna", "d_model": 64}),
    "series": (("forecast", "residual"), {"modality": "timeseries", "d_model": 8, "channels": len(CHANNELS),
                                          "channel_names": CHANNELS, "mean": (0.0,) * len(CHANNELS),
                                          "std": (1.0,) * len(CHANNELS)}),
}


class StandIn:
    """Wraps the worker's model: the same interface, outputs sliced from `real` at no cost
    (after sleeping `sleep` s per call)."""

    def __init__(self, model, real: dict, sleep: float):
        self.model, self.real, self.sleep = model, real, sleep

    def __getattr__(self, name):
        return getattr(self.model, name)

    def _out(self, n, outputs):
        return {o: self.real[o][:n] for o in outputs or self.real}

    def forward(self, x, state, outputs=None):
        time.sleep(self.sleep)
        return self._out(len(x), outputs), state

    def forward_records(self, xs, outputs=None, **_):
        time.sleep(self.sleep)
        return [self._out(len(x), outputs) for x in xs]


def job_store(fasta, model: str, out, outputs=("logprob", "entropy"), unit: int = UNIT,
              input_options: dict | None = None):
    """A job's plan, with its store laid out at `out` (new) under a lease, as a driver lays it
    out; and the lease's token, which a worker checks before each unit's writes."""
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.lease import Lease
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    plan = plan_job(JobRequest(inputs=(str(fasta),), model=model, unit_size=unit, outputs=tuple(outputs),
                               **(input_options or {})))
    lease = Lease(str(out), plan.job_id)
    lease.acquire(force=True)  # from the round before, on the same `out`
    lease.stop_heartbeat()  # the workers compare its token only: no renewals needed here
    open_or_create_store(plan, str(out), overwrite=True)
    return plan, lease.token


def worker_job(fasta: Path, model: str, out: Path, outputs=("logprob", "entropy"), unit: int = UNIT,
               device: str = "cpu", threads: int = 1, input_options: dict | None = None):
    """A job's plan, its store at `out` (new), one PipelineWorker on it, and the worker's calls
    in the driver's order: (method name, args, kwargs)."""
    from linpipe.jobs.actor import PipelineWorker

    plan, lease_token = job_store(fasta, model, out, outputs, unit, input_options)
    w = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device=device, threads=threads,
                       input_options=plan.input_options, lease_token=lease_token)
    calls = [("run_unit", (c,), {"last": i == r.n_units - 1}) for r in plan.streams
             for i, c in enumerate(r.units())]
    calls += [("run_batch", (b, plan.batch_units(b)), {}) for b in range(plan.packed.n_batches)]
    return plan, w, calls


def _job(fasta: Path, model: str, out: Path, sleep: float, outputs, input_options: dict):
    plan, w, calls = worker_job(fasta, model, out, outputs, input_options=input_options)
    u = plan.streams[0].unit(0) if plan.streams else plan.batch_units(0)[0]
    x, _ = w._input(str(fasta)).read(u.record_id, u.start, u.end)
    x = np.resize(x, (UNIT,) + x.shape[1:])
    from_model = [o for o in outputs if o != "softmask"]  # the soft-mask comes from the input
    real, _ = w.model.forward(x, w.model.init_state(), outputs=from_model)
    w.model = StandIn(w.model, real, sleep)
    w.host.model = w.model
    return plan, w, calls


def _serial(w, calls):
    return [getattr(w, name)(*args, **kw) for name, args, kw in calls]


def overlapped(w, calls, in_flight: int = 3):
    """As the driver and Ray run them: at most in_flight calls at once, numbered in order."""
    slots = threading.Semaphore(in_flight)
    with ThreadPoolExecutor(in_flight + 1) as pool:
        futures = []
        for seq, (name, args, kw) in enumerate(calls):
            slots.acquire()
            f = pool.submit(getattr(w, name), *args, seq=seq, **kw)
            f.add_done_callback(lambda _f: slots.release())
            futures.append(f)
        return [f.result() for f in futures]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="the stand-in model's time per call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-mb", type=float, default=32.0, help="the long record's length, in millions")
    ap.add_argument("--cases", default="logprob", help=f"of {', '.join(CASES)}, joined by commas")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=REPO / "bench-out" if (REPO / "bench-out").is_dir() else None) as d:
        for case in args.cases.split(","):
            run_case(Path(d), case, args)


def run_case(d: Path, case: str, args) -> None:
    from linpipe.model import ModelConfig, init_net, save_model

    outputs, config = CASES[case]
    cfg = ModelConfig(n_layers=1, n_heads=1, mlp_hidden=8, conv_width=1, **config)
    save_model(init_net(cfg, seed=0), cfg, d / case)
    inputs = _series_inputs(d, args.records, args.long_mb) if cfg.modality == "timeseries" else \
        {k: (v, {}) for k, v in _inputs(d, args.records, args.long_mb).items()}
    for label, (fasta, options) in inputs.items():
        rates: dict[str, list[float]] = {"serial": [], "overlapped": []}
        split: dict[str, list] = {}
        first: dict[str, list[float]] = {"serial": [], "overlapped": []}  # the first call's seconds
        for _ in range(args.rounds):
            for how, run in (("serial", _serial), ("overlapped", overlapped)):
                plan, w, calls = _job(fasta, str(d / case), d / f"{how}.zarr", args.sleep_ms / 1e3, outputs,
                                      options)
                t0 = time.perf_counter()
                res = run(w, calls)
                wall = time.perf_counter() - t0
                w.close()
                n = sum(r.positions for r in res)
                rates[how].append(n / wall)
                first[how].append(res[0].read_s + res[0].wait_s + res[0].model_s + res[0].write_s)
                split[how] = [sum(getattr(r, k) for r in res) * 1e9 / n
                              for k in ("read_s", "wait_s", "model_s", "write_s")]
        for how, r in rates.items():
            med = statistics.median(r)
            rd, wt, md, wr = split[how]
            print(f"{case:>8} {label:>24} {how:>10}: {med / 1e6:6.2f} M positions/s"
                  f" ({1e9 / med:6.1f} ns/position;"
                  f" per position read {rd:.1f} ns, wait {wt:.1f}, model {md:.1f}, write {wr:.1f};"
                  f" calls {len(calls)}, the first {statistics.median(first[how]) * 1e3:.0f} ms;"
                  f" sleep {args.sleep_ms} ms/call)")


if __name__ == "__main__":
    main()
