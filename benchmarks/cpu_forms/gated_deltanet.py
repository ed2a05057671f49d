"""Gated DeltaNet (the delta rule with a scalar gate) on one CPU thread: linpipe's chunked form
against the plain-PyTorch forms a user could call instead: transformers'
`torch_chunk_gated_delta_rule` (Qwen3-Next's path on a CPU without fla) and fla's
`naive_chunk_gated_delta_rule`.

A form module of benchmarks/bench_cpu_table.py (its interface: OP, SHAPE, make_inputs, FORMS,
REFERENCE, min_flops). `python benchmarks/cpu_forms/gated_deltanet.py [--rounds N]` prints this
op's rows of the table.

Inputs as benchmarks/bench_delta_rule.py makes them: q, k L2-normalised, v ~ N(0, 1), beta =
sigmoid(x), log-gates logsigmoid(x + bias) / 16 around the default model's spread of decays; the
scale K^-0.5 (every form's default), from the zero state, the final state out. The peers run
at their default chunk of 64.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

OP = "gated_deltanet"
SHAPE = {"B": 1, "T": 16384, "H": 4, "K": 64, "V": 64}
REFERENCE = "fla naive_chunk_gated_delta_rule"


def make_inputs(shape: dict, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    B, T, H, K, V = (shape[x] for x in ("B", "T", "H", "K", "V"))
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g))
    spread = torch.tensor([1 - 2.0 ** -(4 + 12 * h / max(H - 1, 1)) for h in range(H)])
    gate = F.logsigmoid(torch.randn(B, T, H, generator=g) + torch.logit(spread ** 16)) / 16
    return {"q": q, "k": k, "v": v, "beta": beta, "g": gate}


def _linpipe(q, k, v, beta, g):
    from linpipe.kernels.delta_rule import chunk_delta_rule_torch

    return chunk_delta_rule_torch(q, k, v, beta, log_gate=g, output_final_state=True)[0]


def _transformers(q, k, v, beta, g):
    import inspect

    from transformers.models.qwen3_next import modeling_qwen3_next

    chunk = inspect.unwrap(modeling_qwen3_next.torch_chunk_gated_delta_rule)
    return chunk(q, k, v, g=g, beta=beta, output_final_state=True)[0]


def _fla(q, k, v, beta, g):
    spec = importlib.util.find_spec("fla")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / "gated_delta_rule" / "naive.py"
    mod_spec = importlib.util.spec_from_file_location("fla_gdn_naive", path)  # not fla/__init__ (Triton)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.naive_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)[0]


FORMS = {
    "linpipe chunk": _linpipe,
    "transformers torch_chunk_gated_delta_rule": _transformers,
    "fla naive_chunk_gated_delta_rule": _fla,
}


def min_flops(shape: dict, c: int | None = None) -> int:
    """The multiply-adds (2 FLOPs each) of linpipe's chunked form at its block size c (32), per
    block of c positions and head, counting only the triangles the algebra needs: the scores
    P = (Q K^T) * decay on and below the diagonal (c (c + 1) / 2 x K), L = beta (K K^T) * decay
    strictly below it (c (c - 1) / 2 x K), the unit-triangular solve for [U | W] (a strict
    triangle times c x (V + K)), the carry u = U - W S and S' = total S + K_end^T u (2 c K V
    multiply-adds), the outputs P u (a triangle times V) and q_in S (c K V). The form computes
    the squares whole (the masks come after): as computed, 2 c^2 (2 K + V) + c^2 (K + V) + 6 c K V
    per block, 18% more at c = 32. Not counted: the elementwise work (the gates' float64 sums
    and powers, the weighted copies of q, k and beta)."""
    if c is None:
        from linpipe.kernels.delta_rule.stages import BLOCK_SIZE

        c = BLOCK_SIZE
    T, K, V = shape["T"], shape["K"], shape["V"]
    tri, strict = c * (c + 1) // 2, c * (c - 1) // 2
    per_block = 2 * tri * K + 2 * strict * K + 2 * strict * (K + V) + 6 * c * K * V + 2 * tri * V
    return per_block * math.ceil(T / c) * shape["B"] * shape["H"]


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_cpu_table import main

    main(["--ops", OP, *sys.argv[1:]])
