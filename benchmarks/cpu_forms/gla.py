"""GLA (a gate per key) on one CPU thread: linpipe's chunked form against the plain-PyTorch GLA a
user could call instead, fla's `naive_recurrent_gla` (the only naive GLA form fla 0.6 has: a
loop over positions; transformers has no GLA).

A form module of benchmarks/bench_cpu_table.py (its interface: OP, SHAPE, make_inputs, FORMS,
REFERENCE, min_flops). `python benchmarks/cpu_forms/gla.py [--rounds N]` prints this op's rows
of the table.

Inputs as benchmarks/bench_chunk_forms.py's `gla` form makes them: q, k, v ~ N(0, 1), log-gates
per key logsigmoid(x + bias) / 16 around the default model's spread of decays; scale K^-0.5
(both forms' default), from the zero state, the final state out.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

OP = "gla"
SHAPE = {"B": 1, "T": 16384, "H": 4, "K": 64, "V": 64}
REFERENCE = "fla naive_recurrent_gla"


def make_inputs(shape: dict, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    B, T, H, K, V = (shape[x] for x in ("B", "T", "H", "K", "V"))
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    spread = torch.tensor([1 - 2.0 ** -(4 + 12 * h / max(H - 1, 1)) for h in range(H)])
    gk = F.logsigmoid(torch.randn(B, T, H, K, generator=g) + torch.logit(spread ** 16)[:, None]) / 16
    return {"q": q, "k": k, "v": v, "g": gk}


def _linpipe(q, k, v, g):
    from linpipe.kernels.gla import chunk_gla_torch

    return chunk_gla_torch(q, k, v, g, output_final_state=True)[0]


def _fla(q, k, v, g):
    spec = importlib.util.find_spec("fla")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / "gla" / "naive.py"
    mod_spec = importlib.util.spec_from_file_location("fla_gla_naive", path)  # not fla/__init__ (Triton)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.naive_recurrent_gla(q, k, v, g, output_final_state=True)[0]


FORMS = {
    "linpipe chunk": _linpipe,
    "fla naive_recurrent_gla": _fla,
}


def min_flops(shape: dict, c: int | None = None) -> int:
    """The multiply-adds (2 FLOPs each) of linpipe's chunked form at its block size c, per block
    of c positions and head, counting only what the algebra needs: the gated scores (q_i
    exp(b_i)) . (k_j exp(-b_j)) on and below the diagonal (c (c + 1) / 2 x K), the scores times
    V (the same triangle x V), the block's local state K_end^T V (c K V), the entering state's
    share Q_in S (c K V) and the fold S' = diag(exp(b_c)) S + dS (K V a block, in order). The
    form computes the squares whole (the mask comes after): as computed 2 c^2 (K + V) + 4 c K V
    + 2 K V, 19% more at c = 32. Not counted: the elementwise work (the gates' sums and
    exponentials, the weighted copies of q and k)."""
    if c is None:
        from linpipe.kernels.gla.chunk import BLOCK_SIZE

        c = BLOCK_SIZE
    T, K, V = shape["T"], shape["K"], shape["V"]
    tri = c * (c + 1) // 2
    per_block = 2 * (tri * K + tri * V + 2 * c * K * V + K * V)
    return per_block * math.ceil(T / c) * shape["B"] * shape["H"]


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_cpu_table import main

    main(["--ops", OP, *sys.argv[1:]])
