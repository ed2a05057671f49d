"""Kimi Delta Attention on one CPU thread: linpipe's chunked form against the plain-PyTorch KDA
a user could call instead (transformers' chunk_kimi_delta_attention, fla's naive_chunk_kda).

A form module of benchmarks/bench_cpu_table.py (its interface: OP, SHAPE, make_inputs, FORMS,
REFERENCE, min_flops). `python benchmarks/cpu_forms/kda.py [--rounds N]` prints this op's rows
of the table.

Inputs as a KDA layer makes them: q, k L2-normalised, beta = sigmoid(x), and the gate of fla's
KimiDeltaAttention at its initialisation, g = -exp(A_log) softplus(x + dt_bias) with A_log =
log U(1, 16) per head and dt_bias the inverse softplus of dt in [1e-3, 0.1] log-uniformly per
channel (decays from ~0.999 to ~0.2 a position), x ~ N(0, 0.5^2).
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

OP = "kda"
SHAPE = {"B": 1, "T": 16384, "H": 4, "HV": 4, "K": 64, "V": 64}
REFERENCE = "fla naive_chunk_kda"


def make_inputs(shape: dict, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    B, T, H, HV, K, V = (shape[x] for x in ("B", "T", "H", "HV", "K", "V"))
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=g)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=g))
    A = torch.empty(HV).uniform_(1, 16, generator=g)
    dt = torch.exp(torch.empty(HV, K).uniform_(math.log(1e-3), math.log(0.1), generator=g))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) = dt
    gate = -A[:, None] * F.softplus(0.5 * torch.randn(B, T, HV, K, generator=g) + dt_bias)
    return {"q": q, "k": k, "v": v, "beta": beta, "g": gate}


def _linpipe(q, k, v, beta, g):
    from linpipe.kernels.kda import chunk_kda_torch

    return chunk_kda_torch(q, k, v, beta, log_gate=g, output_final_state=True)[0]


def _transformers(q, k, v, beta, g):
    import inspect

    from transformers.models.kimi_linear import modeling_kimi_linear

    # its PyTorch path: with fla installed, transformers' wrapper would call fla's Triton kernel
    chunk = inspect.unwrap(modeling_kimi_linear.chunk_kimi_delta_attention)
    return chunk(q, k, v, g=g, beta=beta, output_final_state=True)[0]


def _fla_naive():
    """fla/ops/kda/naive.py loaded from its file (importing the fla package imports Triton)."""
    spec = importlib.util.find_spec("fla")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / "kda" / "naive.py"
    mod_spec = importlib.util.spec_from_file_location("fla_kda_naive", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def _fla(q, k, v, beta, g):
    return _fla_naive().naive_chunk_kda(q, k, v, g, beta, output_final_state=True)[0]


FORMS = {
    "linpipe chunk": _linpipe,
    "transformers chunk_kimi_delta_attention": _transformers,
    "fla naive_chunk_kda": _fla,
}


def min_flops(shape: dict, c: int = 32) -> int:
    """The multiply-adds (2 FLOPs each) of linpipe's chunked form at its block size c (32), per
    block of c positions and value head, counting only the triangles the algebra needs:
    P = (Q K^T) * decay on and below the diagonal, L strictly below, the inverse of the unit
    triangular I + L (c^3 / 3), [U | W] = (I + L)^-1 [V | K] (a triangle times c x (K + V)),
    the carry u = U - W S and S' = D S + K_end^T u (4 c K V), the outputs q_in S (2 c K V) and
    P u (a triangle times c x V). Not counted: the elementwise work (the gates' sums and powers,
    the weighted copies of q and k) and the multiply-adds above the diagonals that the matmuls
    compute and discard."""
    T, K, V = shape["T"], shape["K"], shape["V"]
    tri, strict = c * (c + 1) // 2, c * (c - 1) // 2
    per_block = (2 * tri * K + 2 * strict * K + c ** 3 // 3 + 2 * tri * (K + V) + 4 * c * K * V
                 + 2 * c * K * V + 2 * tri * V)
    return per_block * math.ceil(T / c) * shape["B"] * shape["HV"]


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_cpu_table import main

    main(["--ops", OP, *sys.argv[1:]])
