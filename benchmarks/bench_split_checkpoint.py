"""What a durable split costs and what it saves (issue 65; docs/sequence-parallel.md, "Surviving
a kill"; linpipe/model/checkpoints.py): one command that prints the figures the issue asks for.

1. profile (one process, one torch thread, CPU time): per position, the stream's forward, a
   correcting segment's passes (begin, then apply per layer), and keeping one layer input (the
   store object as the run writes it, not fsynced) and fsyncing it; and the rates the run would
   measure (checkpoints.measure_rates).
2. runs (each a fresh driver with its embedded Ray, in a subprocess; alternated within each rep):
   `--workers 1 --split never`, then `--workers 2 --split auto` under each choice: `keep` (the
   default budget: the layer inputs checkpoints.choose_keeps picks) and `recompute` (budget 0:
   none kept). Per run: positions/s (the job's summary) and wall seconds, the CPU seconds of the
   run's processes (its session's, from /proc: the machine is shared, so the CPU time says what
   the job itself used), the split's per-layer compute, keep and exchange seconds, the largest
   size the split's objects reached on disk (polled) per position, and the load average.
3. kill and resume, per choice: the same 2-worker run SIGKILLed (its whole session) at
   `--kill-at` (0.7) of that choice's full wall time, then resumed; the resume's wall time over
   the full run's.

Usage: python benchmarks/bench_split_checkpoint.py [--out /tmp/bench65] [--length 8000000]
       [--reps 1] [--kill-at 0.7] [--skip-profile] [--skip-kill] [--only before,keep]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

# argv: fasta, out, workers, split, budget ("" for the default); prints one JSON line
DRIVER = r'''
import json, os, sys, time
from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest

fasta, out, workers, split, budget = sys.argv[1:6]


class Events(JobEvents):
    layers, keeps = [], None

    def split_layer(self, record_id, layer, nodes, timing):
        self.layers.append({"layer": layer, **timing})

    def split_keeps(self, record_id, keeps, rates):
        Events.keeps = {"layers": list(keeps.layers), "bytes_per_position": keeps.bytes_per_position,
                        "text": keeps.describe(), "rates": rates.__dict__}


ev = Events()
more = {"split_budget": int(budget)} if budget else {}  # an older checkout has no such option
s = run_job(JobRequest(inputs=(fasta,), out=out, workers=int(workers), split=split,
                       outputs=("logprob", "entropy"), **more), events=ev)
print(json.dumps({"positions_per_s": s.positions_per_s, "seconds": s.seconds, "startup_s": s.startup_s,
                  "positions_run": s.positions_run, "positions_resumed": s.positions_resumed,
                  "layers": ev.layers, "keeps": ev.keeps}), flush=True)
'''


# Imported first by every Python process of a run given another checkout (the driver and Ray's
# workers, which inherit PYTHONPATH): points the editable install's mapping at that checkout.
SWITCH = r'''
import os, sys
code = os.environ.get("LP65_CODE")
for name, mod in list(sys.modules.items()):
    if code and name.startswith("__editable__") and "linpipe" in name and hasattr(mod, "MAPPING"):
        root = os.path.dirname(mod.MAPPING["linpipe"])  # the checkout installed
        for key, path in mod.MAPPING.items():
            mod.MAPPING[key] = code + path[len(root):]
'''


def session_cpu(sid: int, seen: dict) -> None:
    """Updates seen[pid] with the CPU seconds (user + system) of every process of session sid."""
    tick = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.getsid(int(d)) != sid:
                continue
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            seen[int(d)] = max(seen.get(int(d), 0.0), (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError, IndexError):
            pass


def kill_session(sid: int) -> None:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getsid(int(d)) == sid:
                    os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass


def split_bytes(store: Path) -> int:
    """Bytes of the split's objects in the store now (its _linpipe/<key>/split folders)."""
    total = 0
    for top, _dirs, files in os.walk(store / "_linpipe"):
        if "/split" in top.replace(os.sep, "/"):
            for f in files:
                try:
                    total += os.stat(os.path.join(top, f)).st_size
                except OSError:
                    pass
    return total


def drive(fasta: Path, store: Path, workers: int, split: str, budget: str, kill_after: float | None = None,
          fresh: bool = True, code: str | None = None) -> dict:
    """One driver run in a session of its own; kill_after: SIGKILL the session after that many
    seconds; code: another checkout of linpipe to run (the editable install's, else). Returns
    its summary (none when killed) with wall, CPU and peak split bytes."""
    if fresh:
        shutil.rmtree(store, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix="lp65", dir="/tmp")  # short: Ray's socket paths
    env = {**os.environ, "TMPDIR": tmp, "PYTHONUNBUFFERED": "1"}
    if code:
        Path(tmp, "sitecustomize.py").write_text(SWITCH)
        env.update(LP65_CODE=str(Path(code).resolve()),
                   PYTHONPATH=os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH")])))
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    err = open(store.with_name(store.name + ".stderr"), "w")
    argv = [sys.executable, "-c", DRIVER, str(fasta), str(store), str(workers), split, budget]
    proc = subprocess.Popen(argv, env=env, start_new_session=True, cwd=tmp, stdout=subprocess.PIPE,
                            stderr=err, text=True)
    peak, cpu, stop = [0], {}, threading.Event()

    def poll():
        while not stop.is_set():
            peak[0] = max(peak[0], split_bytes(store))
            session_cpu(proc.pid, cpu)
            stop.wait(0.25)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    killed = False
    try:
        if kill_after is not None:
            try:
                proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                kill_session(proc.pid)
                killed = True
        stdout = proc.communicate()[0]
    finally:
        stop.set()
        th.join()
        kill_session(proc.pid)
        err.close()
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    got = lines[-1] if lines and not killed else {}
    if not got and not killed:
        raise SystemExit(f"{store}: the run failed: {Path(err.name).read_text()[-2000:]}")
    return {**got, "workers": workers, "split": split, "budget": budget, "wall_s": wall, "killed": killed,
            "cpu_s": sum(cpu.values()), "peak_split_bytes": peak[0], "loadavg": [load0, os.getloadavg()]}


def profile(length: int = 262_144, rounds: int = 3) -> dict:
    """Per position, CPU microseconds on one thread (medians of `rounds` alternated rounds): the
    stream (units of 65,536, the job's outputs); the record's first segment (`exact`) and a later
    one (`correcting`): begin, apply per layer and the writes' outputs; the 2-worker ceiling
    these give; keeping one layer input (written as the run writes it, then fsynced)."""
    import torch
    from bench_split import DATA, _seqs

    from linpipe.inputs.alphabet import tokenize
    from linpipe.model import load_model
    from linpipe.model.checkpoints import measure_rates
    from linpipe.model.segments import SegmentRunner
    from linpipe.store.location import Location
    from linpipe.store.splits import SplitRecords

    torch.set_num_threads(1)
    x = tokenize(_seqs(DATA / "korflab_hg19_chr1_first3Mb.fa.gz")[0][20_000:20_000 + length])
    m = load_model("default", device="cpu")
    unit, init = 65_536, m.init_state()
    zero = {k: v[0, 0] for k, v in init.arrays.items()}

    def stream():
        t, state = time.process_time(), init
        for a in range(0, length, unit):
            state = m.forward(x[a:a + unit], state, outputs=["logprob", "entropy"])[1]
        return {"stream": time.process_time() - t}

    def segment(exact: bool):
        name = "exact" if exact else "correcting"
        r = SegmentRunner(m, lambda a, b: x[a:b], 0, length, unit, exact=exact)
        got, t = {}, time.process_time()
        r.begin({k: v[0] for k, v in init.arrays.items()} if exact else None)
        got[f"{name}_begin"] = time.process_time() - t
        for layer in range(m.config.n_layers):
            t = time.process_time()
            r.apply(layer, zero)
            got[f"{name}_apply{layer}"] = time.process_time() - t
        t = time.process_time()
        for _ in r.units_out(torch.zeros(m.config.d_model), init):
            pass
        got[f"{name}_outputs"] = time.process_time() - t
        if exact:
            r.close()
        else:
            got["runner"] = r
        return got

    stream()  # warm: the first calls of a process pay for lazy imports and the allocator
    rows: dict[str, list] = {}
    keep = None
    for _ in range(rounds):
        for part in (stream(), segment(True), segment(False)):
            r = part.pop("runner", None)
            for k, v in part.items():
                rows.setdefault(k, []).append(v / length * 1e6)
            if r is not None:
                if keep is not None:
                    keep.close()
                keep = r
    res = {f"{k}_us": float(np.median(v)) for k, v in rows.items()}
    res["rounds"] = rounds
    # two workers, the first segment's share f = c / (e + c) balancing them: the record takes
    # e c / (e + c) per position against the stream's s (keeping and the exchanges on top)
    e = sum(v for k, v in res.items() if k.startswith("exact_"))
    c = sum(v for k, v in res.items() if k.startswith("correcting_"))
    res.update(exact_us=e, correcting_us=c, balanced_weight=c / e,
               two_worker_ceiling=res["stream_us"] * (e + c) / (e * c))
    r = keep
    with tempfile.TemporaryDirectory(dir=REPO.parent) as d:
        loc = Location(d, read_only=False)
        sp = SplitRecords(loc, "rec", [(0, length)])
        for synced in (False, True):
            t, w = time.process_time(), time.perf_counter()
            for a, b in r.units:
                sp.put(f"h/{int(synced)}/{a}", {"h": r.rows(a, b), "layer": np.array([1])}, sync=synced)
            key = "keep_fsynced" if synced else "keep"
            res[f"{key}_cpu_us"] = (time.process_time() - t) / length * 1e6
            res[f"{key}_wall_us"] = (time.perf_counter() - w) / length * 1e6
        res["rates"] = measure_rates(m, loc, "rates").__dict__
    r.close()
    res["loadavg"] = os.getloadavg()
    return res


def main():
    from bench_split import build

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/bench65")
    ap.add_argument("--length", type=int, default=8_000_000)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--kill-at", type=float, default=0.7)
    ap.add_argument("--split", default="auto", help="the 2-worker runs' --split (auto: as a user runs it)")
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--profile-only", action="store_true", help="the one-process profile alone")
    ap.add_argument("--after", default=None, help="a checkout of the code to measure (default: the "
                    "editable install's; a snapshot keeps a long run apart from edits)")
    ap.add_argument("--before", default=None, help="a checkout of the code before (e.g. a worktree of "
                    "the integration branch): its 2-worker run is alternated with this one's")
    ap.add_argument("--only", default=None, help="the 2-worker choices to run, comma-separated, of "
                    "before, keep and recompute (default: all given)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    fa = build(out, a.length)
    results = {"length": a.length, "cpus": os.cpu_count()}
    if not a.skip_profile:
        results["profile"] = profile()
        print("profile", json.dumps(results["profile"]), flush=True)
    if a.profile_only:
        return
    # name: (budget, checkout); the default budget keeps what choose_keeps picks, 0 keeps none
    choices = {**({"before": ("", a.before)} if a.before else {}), "keep": ("", a.after),
               "recompute": ("0", a.after)}
    if a.only:
        choices = {k: v for k, v in choices.items() if k in a.only.split(",")}
    reps = []
    for _ in range(a.reps):
        rep = {"w1": drive(fa, out / "w1.zarr", 1, "never", "", code=a.after)}
        print("w1", json.dumps(rep["w1"]), flush=True)
        for name, (budget, code) in choices.items():
            rep[name] = drive(fa, out / f"w2-{name}.zarr", 2, a.split, budget, code=code)
            print(name, json.dumps(rep[name]), flush=True)
        if not a.skip_kill:
            for name, (budget, code) in choices.items():
                store = out / f"kill-{name}.zarr"
                killed = drive(fa, store, 2, a.split, budget, kill_after=a.kill_at * rep[name]["wall_s"],
                               code=code)
                resumed = drive(fa, store, 2, a.split, budget, fresh=False, code=code)
                rep[f"kill_{name}"] = {"killed": killed, "resumed": resumed,
                                       "ratio": resumed["wall_s"] / rep[name]["wall_s"]}
                print(f"kill {name}", json.dumps(rep[f"kill_{name}"]), flush=True)
        reps.append(rep)
    results["reps"] = reps
    (out / "results65.json").write_text(json.dumps(results, indent=1))
    print(f"\n{a.length:,} positions, {os.cpu_count()} CPUs; [the load average at the run's start]")
    for i, rep in enumerate(reps):
        print_rep(i, rep, choices, a)


def print_rep(i: int, rep: dict, choices, a) -> None:
    """The figures of one rep: 1 worker, then each 2-worker choice against it."""
    w1 = rep["w1"]
    print(f"rep {i}: 1 worker {w1['positions_per_s'] / 1e3:.1f}k positions/s, {w1['wall_s']:.1f} s wall, "
          f"{w1['cpu_s']:.1f} CPU s [{w1['loadavg'][0][0]:.1f}]")
    for name in choices:
        r = rep[name]
        total = {k: sum(x.get(k, 0.0) for x in r["layers"]) for k in ("compute_s", "keep_s", "exchange_s")}
        chosen = (r.get("keeps") or {}).get("text", "its own")
        # S: the wall outside the job's own seconds (start-up, teardown); a resume after a kill
        # at kill_at costs at least (S + (1 - kill_at) (R - S)) / R of a full run of wall R
        S, R = r["wall_s"] - r["seconds"], r["wall_s"]
        least = (S + (1 - a.kill_at) * (R - S)) / R
        bound = (f"    S {S:.1f} s of R {R:.1f} s wall (start-up {r['startup_s']:.1f} s): a resume after "
                 f"a kill at {a.kill_at:.0%} costs at least {least:.2f}x a full run")
        print(f"  2 workers, {name}: {r['positions_per_s'] / w1['positions_per_s']:.2f}x the positions/s "
              f"({r['positions_per_s'] / 1e3:.1f}k), {w1['wall_s'] / r['wall_s']:.2f}x the wall; CPU "
              f"{r['cpu_s']:.1f} s: 2 x 1 worker's / this = {2 * w1['cpu_s'] / r['cpu_s']:.2f}x "
              f"[{r['loadavg'][0][0]:.1f}]")
        first = r["layers"][0] if r["layers"] else {}
        per = [sum(x["segments_s"][k] for x in r["layers"]) for k in range(len(first.get("segments_s", ())))]
        print(f"    layers: slowest segment's compute {total['compute_s']:.1f} s (each segment's: "
              f"{', '.join(f'{v:.1f}' for v in per) or 'not known'}), of it keeping inputs "
              f"{total['keep_s']:.1f} s; exchanges {total['exchange_s']:.2f} s; on disk at most "
              f"{r['peak_split_bytes'] / a.length:.1f} B/position (choice: {chosen})")
        print(bound)
        k = rep.get(f"kill_{name}")
        if k:
            res = k["resumed"]
            print(f"    killed at {a.kill_at:.0%} of its wall, then resumed: {k['ratio']:.2f}x a full run's "
                  f"wall ({res['wall_s']:.1f} s; {res.get('positions_resumed', 0):,.0f} positions' work from "
                  f"before; on disk at most {k['killed']['peak_split_bytes'] / a.length:.1f} B/position)")


if __name__ == "__main__":
    main()
