"""Training throughput of `linpipe train`'s step (the default model's size) with 1 vs 2 torch
threads, measured in one run as ratios (this machine is shared and noisy).

    python benchmarks/bench_train.py [--steps 5]
"""
import argparse
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
    a = ap.parse_args()
    cfg = ModelConfig(modality="dna", d_model=64, n_layers=2, n_heads=4, mlp_hidden=128, conv_width=4)
    net = init_net(cfg, seed=0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randint(0, 4, (a.batch, a.window))
    step_time(net, opt, x, 1, 1)  # warm-up
    res = {t: step_time(net, opt, x, t, a.steps) for t in (1, 2)}
    pos = a.batch * a.window
    for t, (w, c) in res.items():
        print(f"threads={t}: {w:.3f} s/step wall, {c:.3f} s/step CPU, {pos / w:,.0f} positions/s")
    print(f"wall ratio 2 threads / 1 thread: {res[2][0] / res[1][0]:.2f}; "
          f"CPU ratio: {res[2][1] / res[1][1]:.2f}")


if __name__ == "__main__":
    main()
