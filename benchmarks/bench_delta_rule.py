"""The delta rule's CPU chunked form against today's gated linear attention and against
flash-linear-attention's plain PyTorch chunked reference, side by side, at one thread.

Every form runs in its own child process (OMP_NUM_THREADS=1, torch.set_num_threads(1)); rounds
alternate the forms so that a noisy neighbour hits all alike. A child times one call on the same
random float32 inputs (seeded: q, k L2-normalised, beta = sigmoid(x), log-gates logsigmoid(x +
bias) / 16 around the default model's spread of decays, as bench_chunk_forms.py's `gated` form)
in inference mode, final state out, and reports the median of its repeats, in wall-clock time
and in the process's CPU time (on a loaded machine the CPU time is the steadier of the two);
the table gives the medians over rounds, positions per second and each form's speed relative
to `gla` and to `fla`, by both clocks.

Forms:
  gla        linpipe.kernels.chunk_linear_attn_torch with log_gate (elu1, the normaliser)
  gdn:C      linpipe.kernels.delta_rule.chunk_delta_rule_torch with log_gate, block_size C
             (BLOCK_SIZE, 32, by default in the library)
  dn:C       the same without gates (DeltaNet)
  fla        fla's naive_chunk_gated_delta_rule (fla/ops/gated_delta_rule/naive.py, loaded from
             its file: no Triton), its default chunk of 64, same inputs and final state

Usage: python benchmarks/bench_delta_rule.py [--T 16384] [--H 4] [--K 64] [--rounds 5]
       [--repeat 3] [--forms gla gdn:16 gdn:32 gdn:64 dn:32 fla]
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
import torch.nn.functional as F
torch.set_num_threads(1)
form, T, H, K, repeat = sys.argv[1], *map(int, sys.argv[2:6])
g = torch.Generator().manual_seed(0)
q, k = (F.normalize(torch.randn(1, T, H, K, generator=g), dim=-1) for _ in range(2))
v = torch.randn(1, T, H, K, generator=g)
beta = torch.sigmoid(torch.randn(1, T, H, generator=g))
spread = torch.tensor([1 - 2.0 ** -(4 + 12 * h / max(H - 1, 1)) for h in range(H)])
gate = F.logsigmoid(torch.randn(1, T, H, generator=g) + torch.logit(spread ** 16)) / 16
name, _, block = form.partition(":")
if name == "gla":
    from linpipe.kernels import chunk_linear_attn_torch
    call = lambda: chunk_linear_attn_torch(q, k, v, log_gate=gate, output_final_state=True)
elif name in ("gdn", "dn"):
    from linpipe.kernels.delta_rule import chunk_delta_rule_torch
    lg = gate if name == "gdn" else None
    call = lambda: chunk_delta_rule_torch(q, k, v, beta, log_gate=lg, output_final_state=True,
                                          block_size=int(block))
elif name == "fla":
    import importlib.util, os
    spec = importlib.util.find_spec("fla")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "ops", "gated_delta_rule", "naive.py")
    mspec = importlib.util.spec_from_file_location("fla_gdn_naive", path)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    call = lambda: mod.naive_chunk_gated_delta_rule(q, k, v, gate, beta, output_final_state=True)
else:
    raise SystemExit(f"unknown form {form}")
with torch.inference_mode():
    call()
    times, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        call()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
print(json.dumps({"ms": 1e3 * statistics.median(times), "cpu_ms": 1e3 * statistics.median(cpu)}))
"""


def child(form, args):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-c", CHILD, form, str(args.T), str(args.H), str(args.K), str(args.repeat)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--K", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--forms", nargs="+", default=["gla", "gdn:16", "gdn:32", "gdn:64", "dn:32", "fla"])
    p.add_argument("--json", help="write the medians here")
    args = p.parse_args(argv)
    times = {f: [] for f in args.forms}
    for r in range(args.rounds):
        order = args.forms if r % 2 == 0 else args.forms[::-1]  # alternate who runs first
        for form in order:
            times[form].append(child(form, args))
    print(f"T={args.T} H={args.H} K=V={args.K}, 1 thread, median of {args.rounds} alternating rounds "
          f"(each the median of {args.repeat} calls)")
    med = {}
    for clock in ("ms", "cpu_ms"):
        med[clock] = {f: statistics.median(t[clock] for t in ts) for f, ts in times.items()}
        m = med[clock]
        base, fla = m.get("gla"), m.get("fla")
        print(f"\n{'wall' if clock == 'ms' else 'CPU'} time")
        print(f"{'form':<10} {'ms':>9} {'Mpos/s':>8} {'vs gla':>7} {'fla/this':>9}   rounds (ms)")
        for f, x in m.items():
            rel = f"{base / x:7.2f}" if base else "      -"
            vs_fla = f"{fla / x:9.2f}" if fla else "        -"
            rounds = " ".join(f"{t[clock]:.0f}" for t in times[f])
            print(f"{f:<10} {x:9.1f} {args.T / x / 1e3:8.3f} {rel} {vs_fla}   {rounds}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "median": med, "rounds": times}, fh, indent=1)

if __name__ == "__main__":
    main()
