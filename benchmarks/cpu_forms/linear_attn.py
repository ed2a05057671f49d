"""Linear attention with the normaliser on one CPU thread: linpipe's chunked form (elu1 feature
map, no decay: the seeds' family without its decays, the math fla's naive form has) against
the plain-PyTorch form a user could call instead, fla's `naive_chunk_linear_attn` (normalize on).

A form module of benchmarks/bench_cpu_table.py (its interface: OP, SHAPE, make_inputs, FORMS,
REFERENCE, min_flops). `python benchmarks/cpu_forms/linear_attn.py [--rounds N]` prints this
op's rows of the table.

Inputs as benchmarks/bench_chunk_forms.py makes them: q, k, v ~ N(0, 1). linpipe's form applies
phi = elu + 1 itself (inside the timed call) and returns the final state (S, z); fla's gets
phi(q), phi(k) made before the clock starts, scale 1, and has no state to return (nor a decay
or an initial state: it starts from zero). Its normaliser's eps is 1e-10, linpipe's 1e-6.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

OP = "linear_attn"
SHAPE = {"B": 1, "T": 16384, "H": 4, "K": 64, "V": 64}
REFERENCE = "fla naive_chunk_linear_attn"


def make_inputs(shape: dict, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    B, T, H, K, V = (shape[x] for x in ("B", "T", "H", "K", "V"))
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    return {"q": q, "k": k, "v": v, "q_phi": F.elu(q) + 1, "k_phi": F.elu(k) + 1}


def _linpipe(q, k, v, **_):
    from linpipe.kernels import chunk_linear_attn_torch

    return chunk_linear_attn_torch(q, k, v, output_final_state=True)[0]


def _fla(q_phi, k_phi, v, **_):
    spec = importlib.util.find_spec("fla")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / "linear_attn" / "naive.py"
    mod_spec = importlib.util.spec_from_file_location("fla_la_naive", path)  # not fla/__init__ (Triton)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.naive_chunk_linear_attn(q_phi, k_phi, v, scale=1.0, normalize=True)


FORMS = {
    "linpipe chunk": _linpipe,
    "fla naive_chunk_linear_attn": _fla,
}


def min_flops(shape: dict, c: int | None = None) -> int:
    """The multiply-adds (2 FLOPs each) of linpipe's chunked form at its block size c, per block
    of c positions and head, counting only what the algebra needs: the causal scores phi(Q)
    phi(K)^T on and below the diagonal (c (c + 1) / 2 x K), the scores times V (the same
    triangle x V) and their row sums (the denominators' share inside the block), the block's
    local state phi(K)^T V and z (c K (V + 1)), the entering state's share phi(Q) [S | z]
    (c K (V + 1)), and a sequential fold of the blocks' states (K (V + 1) a block). The form
    computes the squares whole (the mask comes after) and folds by G x G matmuls over groups
    of G = PREFIX_GROUP blocks (G K V a block): as computed 2 c^2 (K + V) + 4 c K V + 2 G K V,
    36% more at c = 32. Not counted: phi, the copies into blocks, the division."""
    if c is None:
        from linpipe.kernels.linear_attn.chunk import BLOCK_SIZE

        c = BLOCK_SIZE
    T, K, V = shape["T"], shape["K"], shape["V"]
    tri = c * (c + 1) // 2
    per_block = 2 * (tri * K + tri * V + tri + 2 * c * K * (V + 1) + K * (V + 1))
    return per_block * math.ceil(T / c) * shape["B"] * shape["H"]


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_cpu_table import main

    main(["--ops", OP, *sys.argv[1:]])
