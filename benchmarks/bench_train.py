"""Training throughput of `linpipe train`'s step (the default model's size) with 1 vs 2 torch
threads, or with `--gate` a fixed-decay vs a gated model at 1 thread in alternating rounds,
measured in one run as ratios (this machine is shared and noisy).

    python benchmarks/bench_train.py [--steps 5] [--gate [--rounds 7]]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from linpipe.model import ModelConfig, init_net


def step_time(net, opt, x, threads, steps):
    torch.set_num_threads(threads)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        state = net.initial_state(x.shape[0])
        pred, _, _ = net.predict(x, state)
        loss = F.cross_entropy(pred.reshape(-1, 4), x.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--gate", action="store_true", help="fixed decay vs gated, 1 thread")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    cfg = ModelConfig(modality="dna", d_model=64, n_layers=2, n_heads=4, mlp_hidden=128, conv_width=4)
    x = torch.randint(0, 4, (a.batch, a.window))
    if a.gate:
        runs = {}
        for name, c in (("fixed decay", cfg), ("gated", cfg.replace(gate_normalizer=16.0))):
            net = init_net(c, seed=0)
            runs[name] = (net, torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-3))
            step_time(*runs[name], x, 1, 1)  # warm-up
        times = {name: [] for name in runs}
        for _ in range(a.rounds):
            for name, (net, opt) in runs.items():
                times[name].append(step_time(net, opt, x, 1, a.steps)[0])
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, t in med.items():
            print(f"{name}: {1e3 * t:.1f} ms/step (median of {a.rounds} rounds of {a.steps} steps)")
        print(f"gated / fixed decay: {med['gated'] / med['fixed decay']:.2f}")
        return
    net = init_net(cfg, seed=0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    step_time(net, opt, x, 1, 1)  # warm-up
    res = {t: step_time(net, opt, x, t, a.steps) for t in (1, 2)}
    pos = a.batch * a.window
    for t, (w, c) in res.items():
        print(f"threads={t}: {w:.3f} s/step wall, {c:.3f} s/step CPU, {pos / w:,.0f} positions/s")
    print(f"wall ratio 2 threads / 1 thread: {res[2][0] / res[1][0]:.2f}; "
          f"CPU ratio: {res[2][1] / res[1][1]:.2f}")


if __name__ == "__main__":
    main()
