"""The CPU chunked form of linear attention, with and without a decay, and with per-position
log-gates, side by side (and against an older linpipe and flash-linear-attention's plain
PyTorch reference when given).

Every (side, form) runs in its own child process at one thread; rounds alternate the sides so
that a noisy neighbour hits all alike. A child times `chunk_linear_attn_torch` (elu1, the
normaliser, final state) on random float32 inputs in inference mode and reports the median of
its repeats; the table gives the median over rounds.

Forms: `none` (no decay), `decay` (the default model's spread of fixed decays), `gated`
(per-position log-gates logsigmoid(x)/16 around the same decays, as a gated model makes them),
`strong` (logsigmoid(x) of x ~ N(-4, 4^2): gates that empty the state within a block, whose
weights reach float32's subnormal range) and `gla` (linpipe.kernels.gla's chunked form: a gate
per key, (B, T, H, K) log-gates made as `gated`'s, no feature map, no normaliser).

Sides: `new` (this checkout), `old` (--old-site: a `pip install --no-deps --target DIR` of an
older linpipe), `fla` (--fla-site: a folder holding `fla` (pip install --no-deps --target DIR
fla-core einops); its `naive_chunk_linear_attn`, normaliser on, phi applied before the timer,
no decay and no carried state: it has neither; and `fla gla`, its `naive_recurrent_gla`, the only
naive GLA form fla 0.6 has, on the `gla` form's inputs with the final state).

Usage: python benchmarks/bench_chunk_forms.py [--old-site DIR] [--fla-site DIR] [--T 16384]
       [--H 4] [--K 64] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
side, form, T, H, K, repeat = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, T, H, K, generator=g) for _ in range(3))
if side == "fla" and form == "gla":
    import importlib.util, os
    path = os.path.join(sys.argv[7], "fla", "ops", "gla", "naive.py")
    spec = importlib.util.spec_from_file_location("fla_gla_naive", path)  # not fla/__init__ (Triton)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    spread = torch.tensor([1 - 2.0 ** -(4 + 12 * h / max(H - 1, 1)) for h in range(H)])
    gk = torch.nn.functional.logsigmoid(torch.randn(1, T, H, K, generator=g)
                                        + torch.logit(spread ** 16)[:, None]) / 16
    call = lambda: mod.naive_recurrent_gla(q, k, v, gk, output_final_state=True)
elif side == "fla":
    import importlib.util, os
    sys.path.insert(0, sys.argv[7])  # for einops
    path = os.path.join(sys.argv[7], "fla", "ops", "linear_attn", "naive.py")
    spec = importlib.util.spec_from_file_location("fla_naive", path)  # not fla/__init__ (Triton)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    qf, kf = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    call = lambda: mod.naive_chunk_linear_attn(qf, kf, v, scale=1.0, normalize=True)
else:
    from linpipe.kernels import chunk_linear_attn_torch
    spread = torch.tensor([1 - 2.0 ** -(4 + 12 * h / max(H - 1, 1)) for h in range(H)])  # the default model's
    decay = spread if form == "decay" else None
    gate = None
    if form == "gated":  # the bias that gives the spread's decays at x = 0, as init_net sets it
        bias = torch.logit(spread ** 16)
        gate = torch.nn.functional.logsigmoid(torch.randn(1, T, H, generator=g) + bias) / 16
    elif form == "strong":
        gate = torch.nn.functional.logsigmoid(torch.randn(1, T, H, generator=g) * 4 - 4)
    call = lambda: chunk_linear_attn_torch(q, k, v, decay=decay, log_gate=gate, output_final_state=True)
    if form == "gla":  # a gate per key, around the same decays
        from linpipe.kernels.gla import chunk_gla_torch
        gk = torch.nn.functional.logsigmoid(torch.randn(1, T, H, K, generator=g)
                                            + torch.logit(spread ** 16)[:, None]) / 16
        call = lambda: chunk_gla_torch(q, k, v, gk, output_final_state=True)
with torch.inference_mode():
    call()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
print(json.dumps({"ms": 1e3 * statistics.median(times)}))
"""


def child(side, form, args, site):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    if site and side == "old":
        env["PYTHONPATH"] = site
    cmd = [sys.executable, "-c", CHILD, side, form, str(args.T), str(args.H), str(args.K), str(args.repeat)]
    if side == "fla":
        cmd.append(site)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-site")
    ap.add_argument("--fla-site")
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--forms", default="none,decay,gated,strong,gla", help="forms of this checkout to time")
    args = ap.parse_args()
    runs = [("new", f, None) for f in args.forms.split(",")]
    if args.old_site:
        old = os.path.abspath(args.old_site)
        runs += [("old", "none", old), ("old", "decay", old)]
    if args.fla_site:
        runs.append(("fla", "none", os.path.abspath(args.fla_site)))
        if "gla" in args.forms.split(","):
            runs.append(("fla", "gla", os.path.abspath(args.fla_site)))
    times = {(s, f): [] for s, f, _ in runs}
    load = os.getloadavg()
    for _ in range(args.rounds):
        for side, form, site in runs:
            times[(side, form)].append(child(side, form, args, site))
    print(json.dumps({"load_before": load, "load_after": os.getloadavg(),
                      "rounds": {f"{s} {f}": t for (s, f), t in times.items()}}))
    print(f"\nB=1 T={args.T} H={args.H} K=V={args.K}, float32, elu1, normaliser, 1 thread; "
          f"median of {args.rounds} rounds (each a median of {args.repeat} calls)\n")
    print("| side | form | ms (median) | range | / decay |")
    print("|---|---|---|---|---|")
    base = statistics.median(times[("new", "decay")]) if ("new", "decay") in times else None
    for (side, form), t in times.items():
        ratio = f"{statistics.median(t) / base:.2f}" if base else "-"
        print(f"| {side} | {form} | {statistics.median(t):.1f} | {min(t):.1f}-{max(t):.1f} | {ratio} |")


if __name__ == "__main__":
    main()
