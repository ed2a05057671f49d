"""The scalar gate (simple GLA, Mamba2's SSD, RetNet with gates) on one CPU thread: linpipe's
chunked linear attention with per-position log-gates, no feature map and no normaliser (the form
the mamba2, retnet and simple-GLA models call), against the plain-PyTorch forms a user could call
instead: fla's `naive_chunk_simple_gla` and transformers' `mamba2_chunk_scan` (Mamba2Mixer's
path on a CPU without mamba_ssm).

A form module of benchmarks/bench_cpu_table.py (its interface: OP, SHAPE, make_inputs, FORMS,
REFERENCE, min_flops). `python benchmarks/cpu_forms/scalar_gate.py [--rounds N]` prints this op's
rows of the table.

Inputs as a Mamba2 layer makes them (pipeline/model/families/mamba2: q = C, k = B, v = dt x, the
log-gate dt A): x, B, C = silu of N(0, 1) (the conv's output after its SiLU), dt log-uniform in
[1e-3, 0.1] per head (Mamba2's dt init) moved per position by softplus, A = -U(1, 16) per head
(Mamba2's A_init_range); one group per head. Each form gets them in its own terms, made before
the clock starts: fla's (q, k, v, g, scale 1), transformers' (x, dt, A, B, C; no D, dt already
through its softplus) at Mamba2Config's default chunk of 256.
"""
from __future__ import annotations

import math
from pathlib import Path

OP = "scalar_gate"
SHAPE = {"B": 1, "T": 16384, "H": 4, "K": 64, "V": 64}
REFERENCE = "fla naive_chunk_simple_gla"
MAMBA2_CHUNK = 256  # Mamba2Config.chunk_size's default


def make_inputs(shape: dict, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    B, T, H, K, V = (shape[x] for x in ("B", "T", "H", "K", "V"))
    g = torch.Generator().manual_seed(seed)
    x = F.silu(torch.randn(B, T, H, V, generator=g))
    Bm, Cm = (F.silu(torch.randn(B, T, H, K, generator=g)) for _ in range(2))
    dt0 = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(0.1), generator=g))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))  # softplus(dt_bias) = dt0
    dt = F.softplus(0.5 * torch.randn(B, T, H, generator=g) + dt_bias)  # (B, T, H)
    A = -torch.empty(H).uniform_(1, 16, generator=g)
    return {"q": Cm, "k": Bm, "v": x * dt.unsqueeze(-1), "log_gate": dt * A,
            "x": x, "dt": dt, "A": A}


def _linpipe(q, k, v, log_gate, **_):
    from linpipe.kernels import chunk_linear_attn_torch

    return chunk_linear_attn_torch(q, k, v, feature_map="identity", normalize=False, log_gate=log_gate,
                                   output_final_state=True)[0]


def _fla_naive():
    """fla/ops/simple_gla/naive.py loaded from its file (importing the fla package imports Triton)."""
    import importlib.util

    spec = importlib.util.find_spec("fla")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / "simple_gla" / "naive.py"
    mod_spec = importlib.util.spec_from_file_location("fla_simple_gla_naive", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def _fla(q, k, v, log_gate, **_):
    return _fla_naive().naive_chunk_simple_gla(q, k, v, log_gate, scale=1.0, output_final_state=True)[0]


def _transformers(x, dt, A, q, k, **_):
    import inspect

    from transformers.models.mamba2 import modeling_mamba2

    # its PyTorch path (with mamba_ssm or HF's kernels installed the wrapper would call those)
    scan = inspect.unwrap(modeling_mamba2.mamba2_chunk_scan)
    return scan(x, dt, A, k, q, chunk_size=MAMBA2_CHUNK, return_final_states=True)[0]


FORMS = {
    "linpipe chunk": _linpipe,
    "fla naive_chunk_simple_gla": _fla,
    "transformers mamba2_chunk_scan": _transformers,
}


def min_flops(shape: dict, c: int | None = None) -> int:
    """The multiply-adds (2 FLOPs each) of linpipe's chunked form at its block size c (32), per
    block of c positions and head, counting only what the algebra needs: the gated causal scores
    (q_i 2^(b_i)) . (k_j 2^(-b_j)) on and below the diagonal (c (c + 1) / 2 x K), the scores
    times V (the same triangle x V), the block's local state K_end^T V (c K V), the entering
    state's share Q_in S (c K V) and a sequential fold of the blocks' states (K V a block). The
    form computes the squares whole (the causal mask comes after) and folds by G x G matmuls over
    groups of G = PREFIX_GROUP blocks (G K V a block): as computed, 2 c^2 (K + V) + 4 c K V +
    2 G K V per block, 37% more at c = 32 (`computed_flops`). Not counted: the elementwise work
    (the gates' float64 sums and powers, the weighted copies of q and k, the causal mask)."""
    from linpipe.kernels.linear_attn.chunk import BLOCK_SIZE

    c = BLOCK_SIZE if c is None else c
    T, K, V = shape["T"], shape["K"], shape["V"]
    tri = c * (c + 1) // 2
    per_block = 2 * (tri * K + tri * V + 2 * c * K * V + K * V)
    return per_block * math.ceil(T / c) * shape["B"] * shape["H"]


def computed_flops(shape: dict, c: int | None = None) -> int:
    """The FLOPs of the matmuls linpipe's chunked form runs, squares whole and the grouped fold
    (min_flops' docstring)."""
    from linpipe.kernels.linear_attn.chunk import BLOCK_SIZE
    from linpipe.kernels.linear_attn.stages import PREFIX_GROUP

    c = BLOCK_SIZE if c is None else c
    T, K, V = shape["T"], shape["K"], shape["V"]
    per_block = 2 * c * c * (K + V) + 4 * c * K * V + 2 * PREFIX_GROUP * K * V
    return per_block * math.ceil(T / c) * shape["B"] * shape["H"]


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_cpu_table import main

    main(["--ops", OP, *sys.argv[1:]])
