"""Mamba's (v1) selective scan on one CPU thread: linpipe's chunked form against the plain-PyTorch
scan a user could call instead (transformers' `mamba_selective_scan`, MambaMixer's path on a CPU
without mamba_ssm: a Python loop over positions).

A form module of the CPU speed table (its interface: OP, SHAPE, make_inputs, FORMS, REFERENCE,
min_flops). `python benchmarks/cpu_forms/mamba.py [--rounds N] [--T T]` prints this op's rows:
every form in its own child process at one thread, rounds alternating the forms' order, CPU
time (and wall) medians over the rounds, each output's largest difference from REFERENCE's, and
GFLOP/s of min_flops against a batched 64x64 float32 matmul measured in the same run. Since
linpipe's form is elementwise work (no matmul of any size), the run also times the elementwise
passes it is made of, at its span's size, and prints the bound they set.

Inputs as a Mamba layer makes them: u = silu of a conv output, delta = dt_proj's output before its
bias, delta_bias = the inverse softplus of dt in [1e-3, 0.1] (log-uniform per channel: Mamba's
init), A = -exp(A_log) with A_log = log(1..N) per channel (S4D-real, Mamba's init) moved a little,
B, C, z ~ N(0, 1), D ~ N(1, 0.1^2); softplus on, the final state out.
"""
from __future__ import annotations

import math
from pathlib import Path

OP = "mamba"
SHAPE = {"B": 1, "T": 16384, "D": 256, "N": 16}
REFERENCE = "transformers mamba_selective_scan"


def make_inputs(shape: dict, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    B, T, D, N = (shape[x] for x in ("B", "T", "D", "N"))
    g = torch.Generator().manual_seed(seed)
    u = F.silu(torch.randn(B, T, D, generator=g))
    delta = 0.5 * torch.randn(B, T, D, generator=g)
    dt = torch.exp(torch.empty(D).uniform_(math.log(1e-3), math.log(0.1), generator=g))
    delta_bias = dt + torch.log(-torch.expm1(-dt))  # softplus(delta_bias) = dt
    A_log = torch.log(torch.arange(1, N + 1, dtype=torch.float32)) + 0.1 * torch.randn(D, N, generator=g)
    B_, C_ = torch.randn(B, T, N, generator=g), torch.randn(B, T, N, generator=g)
    z, skip = torch.randn(B, T, D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    return {"u": u, "delta": delta, "A": -torch.exp(A_log), "B": B_, "C": C_, "D": skip, "z": z,
            "delta_bias": delta_bias}


def _linpipe(u, delta, A, B, C, D, z, delta_bias):
    from linpipe.kernels.mamba import chunk_selective_scan_torch

    return chunk_selective_scan_torch(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
                                      delta_softplus=True, output_final_state=True)[0]


def _transformers(u, delta, A, B, C, D, z, delta_bias):
    import inspect

    from transformers.models.mamba import modeling_mamba

    # its PyTorch path (with mamba_ssm or HF's kernels installed the wrapper would call those)
    scan = inspect.unwrap(modeling_mamba.mamba_selective_scan)
    y, _ = scan(u.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2), D=D,
                z=z.transpose(1, 2), delta_bias=delta_bias, delta_softplus=True, return_last_state=True)
    return y.transpose(1, 2)  # (B, T, D)


FORMS = {
    "linpipe chunk": _linpipe,
    "transformers mamba_selective_scan": _transformers,
}


def min_flops(shape: dict, c: int = 16) -> int:
    """The floating-point operations of linpipe's chunked form at its block size c (16). Per
    (position, state, channel) element: the exponent dt A (1), the input dt u B (1), the block's
    scan h_i = a_i h_{i-1} + x_i (2), the cumulative decay P_i = a_i P_{i-1} (1), the entering
    state's share h_i += P_i h_in (2) and y = sum_n C_n h_n (2): 9. Per block and element the fold
    over blocks (2); per (position, channel) dt u (1), the bias (1), D u (2) and the gate (1). Not
    counted: one exp2 per element (T D N of them; the softplus and the SiLU are per position and
    channel), and the padding of a last partial block."""
    B, T, D, N = (shape[x] for x in ("B", "T", "D", "N"))
    return B * (9 * T * D * N + 2 * math.ceil(T / c) * D * N + 5 * T * D)


CHILD = r"""
import importlib.util, json, sys, time
import torch
torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("cpu_form_mamba", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
kind, name, T, out = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
shape = dict(mod.SHAPE, T=T)
if kind == "form":
    inputs = mod.make_inputs(shape, 0)
    fn = mod.FORMS[name]
    with torch.inference_mode():
        fn(**{k: v[:, :64] if v.dim() == 3 else v for k, v in inputs.items()})  # imports, buffers
        c, w = time.process_time(), time.perf_counter()
        y = fn(**inputs)
        cpu, wall = time.process_time() - c, time.perf_counter() - w
    torch.save(y.contiguous(), out)
    print(json.dumps({"cpu": cpu, "wall": wall}))
elif kind == "matmul":  # batched 64 x 64 float32 products
    a, b = torch.randn(256, 64, 64), torch.randn(256, 64, 64)
    torch.bmm(a, b)
    reps, c = 200, time.process_time()
    for _ in range(reps):
        torch.bmm(a, b)
    print(json.dumps({"gflops": 2 * 64 ** 3 * 256 * reps / (time.process_time() - c) / 1e9}))
else:  # the elementwise passes linpipe's form is made of, over T D N elements at its span's size
    from linpipe.kernels.mamba import stages
    D, N = shape["D"], shape["N"]
    span = stages.span_positions(1, D, N, stages.BLOCK_SIZE)
    x, y, z = (torch.rand(span, N, D) for _ in range(3))
    spans = max(1, T * D * N // x.numel())
    res = {}
    for op, f in (("exp2", lambda: torch.exp2(x, out=z)), ("mul", lambda: torch.mul(x, y, out=z)),
                  ("addcmul", lambda: torch.addcmul(z, x, y, out=z))):
        f()
        c = time.process_time()
        for _ in range(spans):
            f()
        res[op] = (time.process_time() - c) * (T * D * N) / (spans * x.numel())
    print(json.dumps(res))
"""


def _child(kind: str, name: str, T: int, out: str) -> dict:
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).resolve()), kind, name, str(T), out],
                       capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"{kind} {name}: {r.stderr.strip().splitlines()[-1]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    import argparse
    import statistics
    import tempfile

    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--T", type=int, default=SHAPE["T"])
    args = p.parse_args(argv)
    shape = dict(SHAPE, T=args.T)
    names = list(FORMS)
    times = {n: [] for n in names}
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        outs = {n: str(Path(tmp) / f"{i}.pt") for i, n in enumerate(names)}
        for r in range(args.rounds):
            rates.append(_child("matmul", "", args.T, "")["gflops"])
            for n in names[r % len(names):] + names[:r % len(names)]:  # each round another order
                times[n].append(_child("form", n, args.T, outs[n]))
        passes = _child("passes", "", args.T, "")
        ref = torch.load(outs[REFERENCE])
        diffs = {n: float((torch.load(outs[n]) - ref).abs().max()) for n in names}
    rate = statistics.median(rates)
    flops = min_flops(shape)
    cpu = {n: statistics.median(t["cpu"] for t in times[n]) for n in names}
    peers = [n for n in names if not n.startswith("linpipe")]
    fastest = min(peers, key=cpu.get)
    print(f"{OP}: {shape}, one thread, CPU-time medians of {args.rounds} alternated rounds; min_flops "
          f"{flops / 1e9:.3f} GFLOP; batched 64x64 float32 matmul {rate:.1f} GFLOP/s")
    print(f"| form | CPU s | wall s | vs {fastest} | GFLOP/s | % of matmul | max abs diff vs {REFERENCE} |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        wall = statistics.median(t["wall"] for t in times[n])
        gf = flops / cpu[n] / 1e9
        print(f"| {n} | {cpu[n]:.3f} | {wall:.3f} | {cpu[fastest] / cpu[n]:.2f}x | {gf:.2f} "
              f"| {100 * gf / rate:.1f}% | {diffs[n]:.2e} |")
    # linpipe's form: 7 elementwise passes over the T D N elements (the exponent, exp2, the input,
    # the scan, the cumulative decay, the share, the C product) plus the fold and per-position work
    bound = passes["exp2"] + 3 * passes["mul"] + 3 * passes["addcmul"]
    elements = shape["T"] * shape["D"] * shape["N"]
    print(f"elementwise bound of linpipe chunk: exp2 {passes['exp2']:.3f} s + 3 x mul {passes['mul']:.3f} s "
          f"+ 3 x addcmul {passes['addcmul']:.3f} s over T D N = {elements:,} elements at its span's size "
          f"= {bound:.3f} s: linpipe chunk runs at {100 * bound / cpu['linpipe chunk']:.0f}% of it")


if __name__ == "__main__":
    main()
