"""The CPU speed table of issue 66: every op's forms side by side at one thread, with the float32
matmul rate measured in the same run.

Every module in benchmarks/cpu_forms/ (a file not starting with "_") is one op and declares

    OP = "name"; SHAPE = {...}                    # the op and the shape it is timed at
    def make_inputs(shape, seed) -> dict          # float32 CPU tensors, the op's inputs
    FORMS = {"linpipe chunk": fn, "<peer> <name>": fn, ...}   # fn(**inputs) -> output tensor
    REFERENCE = "<form whose output the others are compared to>"
    def min_flops(shape) -> int                   # linpipe's chunked algorithm's FLOPs

Each (op, form) and the matmul probe run in a child process of their own at one thread
(OMP/MKL_NUM_THREADS=1, torch.set_num_threads(1), inference mode, cwd outside the checkout so
that its top folder `kernels/` cannot shadow Hugging Face's package of that name). A child
makes the inputs (seed 0), calls the form once untimed, then `--repeat` times (once when the
untimed call took over 2 s), and reports the median CPU time (process time: the steadier clock
on a shared machine) and wall time of its calls. Rounds alternate the order of all children
(rotated each round, reversed every other), so a noisy neighbour hits every form alike; the
table gives medians over rounds. Outputs of the first round are compared with the op's
REFERENCE form (max abs difference).

The matmul rate: batched 64 x 64 float32 matmuls (torch.bmm on 256 of them), the FLOP rate of
the shape the chunked forms' products have, one child per round like the forms.

Columns: seconds (median CPU time); "x fastest peer" the fastest peer's seconds over this
form's (> 1: faster; peers are the forms not named "linpipe ..."); GFLOP/s the op's min_flops
over this form's seconds (the same count for every form of an op: linpipe's algorithm's work);
"% matmul" that rate over the matmul rate; max |diff| against REFERENCE.

    python benchmarks/bench_cpu_table.py [--ops kda,mamba] [--rounds 3] [--repeat 3] [--json F]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMS_DIR = HERE / "cpu_forms"
MATMUL = ("matmul", "bmm 256 x 64x64x64")
SLOW_S = 2.0  # a form whose untimed call takes longer is timed once per round


def load(path: Path):
    """A form module by its file path."""
    spec = importlib.util.spec_from_file_location(f"cpu_forms_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("OP", "SHAPE", "make_inputs", "FORMS", "REFERENCE", "min_flops"):
        if not hasattr(mod, name):
            raise SystemExit(f"{path}: a cpu_forms module must define {name}")
    if mod.REFERENCE not in mod.FORMS:
        raise SystemExit(f"{path}: REFERENCE {mod.REFERENCE!r} is not one of its FORMS")
    return mod


def modules(ops=None) -> dict:
    """{op: module} of benchmarks/cpu_forms/, those of `ops` only when given."""
    mods = {}
    for path in sorted(FORMS_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            mod = load(path)
        except (Exception, SystemExit) as e:  # one broken module must not take the others' rows
            print(f"skipping {path.relative_to(HERE.parent)}: {e}", file=sys.stderr)
            continue
        mods[mod.OP] = mod
    if ops:
        unknown = [op for op in ops if op not in mods]
        if unknown:
            raise SystemExit(f"unknown op(s) {', '.join(unknown)}; "
                             f"benchmarks/cpu_forms/ has {', '.join(mods)}")
        mods = {op: mods[op] for op in ops}
    return mods


def child_main(argv) -> None:
    """In the child: time one form (or the matmul probe) and print a JSON line."""
    import time

    import torch

    torch.set_num_threads(1)
    p = argparse.ArgumentParser()
    p.add_argument("module")
    p.add_argument("form")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--save", default="")
    a = p.parse_args(argv)
    if a.module == MATMUL[0]:
        x, y = torch.randn(256, 64, 64), torch.randn(256, 64, 64)
        flops = 2 * 256 * 64 ** 3
        reps = 50

        def call():
            for _ in range(reps):
                torch.bmm(x, y)
    else:
        mod = load(Path(a.module))
        inputs = mod.make_inputs(mod.SHAPE, 0)
        fn = mod.FORMS[a.form]

        def call():
            return fn(**inputs)
    with torch.inference_mode():
        t0 = time.process_time()
        out = call()
        first = time.process_time() - t0
        repeat = 1 if first > SLOW_S else max(1, a.repeat)
        cpu, wall = [], []
        for _ in range(repeat):
            t, c = time.perf_counter(), time.process_time()
            call()
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    res = {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall)}
    if a.module == MATMUL[0]:
        res["gflops"] = flops * reps / res["cpu_s"] / 1e9
    elif a.save:
        torch.save(out.detach().float().contiguous(), a.save)
    print(json.dumps(res))


def run_child(module: str, form: str, repeat: int, save: str, cwd: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", module, form, "--repeat", str(repeat)]
    if save:
        cmd += ["--save", save]
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        print(f"{module} / {form} failed: {tail}", file=sys.stderr)
        return {}
    return json.loads(r.stdout.strip().splitlines()[-1])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} CPUs, load average {load:.1f} at the start"


def table(mods, times, diffs, matmul_gflops, rounds, repeat) -> str:
    import torch

    lines = [f"CPU time, one thread, median of {rounds} alternating rounds (each the median of up to "
             f"{repeat} calls); {machine()}; torch {torch.__version__}; {datetime.date.today().isoformat()}; "
             f"float32 matmul rate ({MATMUL[1]}): {matmul_gflops:.1f} GFLOP/s",
             "",
             "| op | form | seconds | x fastest peer | GFLOP/s | % matmul | max abs diff |",
             "|---|---|---|---|---|---|---|"]
    for op, mod in mods.items():
        secs = {f: statistics.median(ts) for f, ts in times[op].items() if ts}
        peers = [s for f, s in secs.items() if not f.startswith("linpipe")]
        fastest = min(peers) if peers else None
        flops = mod.min_flops(mod.SHAPE)
        shape = ", ".join(f"{k}={v}" for k, v in mod.SHAPE.items())
        for f in mod.FORMS:
            if f not in secs:
                lines.append(f"| {op} ({shape}) | {f} | failed | | | | |")
                continue
            s = secs[f]
            rate = flops / s / 1e9
            ratio = f"{fastest / s:.2f}x" if fastest else "-"
            diff = "reference" if f == mod.REFERENCE else (f"{diffs[op][f]:.2e}" if f in diffs[op] else "-")
            lines.append(f"| {op} ({shape}) | {f} | {s:.4g} | {ratio} | {rate:.1f} | "
                         f"{100 * rate / matmul_gflops:.0f}% | {diff} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="", help="comma-separated ops (default: every module in cpu_forms/)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3, help="timed calls per child (1 for a call over 2 s)")
    p.add_argument("--json", help="also write every measurement here")
    args = p.parse_args(argv)
    import torch

    mods = modules([op for op in args.ops.split(",") if op])
    jobs = [(op, f) for op, mod in mods.items() for f in mod.FORMS] + [MATMUL]
    times = {op: {f: [] for f in mod.FORMS} for op, mod in mods.items()}
    mm = []
    diffs = {op: {} for op in mods}
    with tempfile.TemporaryDirectory(prefix="linpipe_cpu_table_") as tmp:
        saved = {}
        for r in range(args.rounds):
            shift = r % len(jobs)
            order = jobs[shift:] + jobs[:shift]
            for op, form in (order if r % 2 == 0 else order[::-1]):
                if (op, form) == MATMUL:
                    res = run_child(MATMUL[0], MATMUL[1], 3, "", tmp)
                    if res:
                        mm.append(res["gflops"])
                    continue
                save = str(Path(tmp) / f"{op}-{len(saved)}.pt") if (op, form) not in saved else ""
                res = run_child(str(Path(mods[op].__file__).resolve()), form, args.repeat, save, tmp)
                if res:
                    times[op][form].append(res["cpu_s"])
                    if save:
                        saved[(op, form)] = save
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        for op, mod in mods.items():
            ref = saved.get((op, mod.REFERENCE))
            if ref is None:
                continue
            want = torch.load(ref)
            for f in mod.FORMS:
                if f != mod.REFERENCE and (op, f) in saved:
                    got = torch.load(saved[(op, f)])
                    same = got.shape == want.shape
                    diffs[op][f] = float((got - want).abs().max()) if same else float("nan")
    matmul_gflops = statistics.median(mm) if mm else float("nan")
    print(table(mods, times, diffs, matmul_gflops, args.rounds, args.repeat))
    if args.json:
        record = {"times": times, "matmul_gflops": mm, "diffs": diffs}
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
