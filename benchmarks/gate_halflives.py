"""What a gated model's heads keep: per layer and head, the mean decay exp(g) of its gates over
the first 200 kb of a FASTA file's longest record, the half-life of its mean log-gate, the 1st,
50th and 99th percentiles of the decay, and the share of positions that keep less than half.

    python benchmarks/gate_halflives.py MODEL FASTA [--positions 200000]
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F

import linpipe
from linpipe.training.data import read_dna_records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("fasta")
    ap.add_argument("--positions", type=int, default=200_000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    m = linpipe.load_model(a.model)
    if not m.config.gated:
        raise SystemExit(f"{a.model}: not a gated model")
    _, x = max(read_dna_records(a.fasta), key=lambda r: len(r[1]))
    x = torch.from_numpy(x[:a.positions].astype(np.int64))[None]
    gates = {i: [] for i in range(len(m.net.layers))}
    for i, layer in enumerate(m.net.layers):  # the log-gates each layer computes, as it runs
        layer.attn.gk_proj.register_forward_hook(
            lambda mod, inp, out, i=i: gates[i].append(F.logsigmoid(out[0]) / m.config.gate_normalizer))
    with torch.no_grad():
        state = m.net.initial_state(1)
        for s in range(0, x.shape[1], 2048):
            _, state = m.net(x[:, s:s + 2048], state)
    for i, parts in gates.items():
        g = torch.cat(parts[1:]).double()  # the first call is the BOS step of initial_state
        d = torch.exp(g)
        print(f"layer {i} (bias alone: {', '.join(f'{v:.6f}' for v in m.net.layers[i].attn.base_decay())})")
        for h in range(g.shape[1]):
            p1, p50, p99 = np.percentile(d[:, h].numpy(), [1, 50, 99])
            half = float(np.log(0.5) / g[:, h].mean())
            print(f"  head {h}: mean decay {float(d[:, h].mean()):.6f}, half-life {half:,.0f}, "
                  f"decay p1/p50/p99 {p1:.5f} {p50:.5f} {p99:.6f}, "
                  f"keeping < 50%: {float((d[:, h] < 0.5).double().mean()):.4f}")


if __name__ == "__main__":
    main()
