"""The mLSTM on one CPU thread: linpipe's chunked form against the plain-PyTorch mLSTM a user could
call instead (transformers' native chunkwise kernel, the one xLSTMForCausalLM runs on a CPU
without the xlstm package).

A form module of the CPU speed table (its interface: OP, SHAPE, make_inputs, FORMS, REFERENCE,
min_flops). `python benchmarks/cpu_forms/mlstm.py [--rounds N] [--repeat R] [--T T] [--context]` prints this
op's rows by itself: every form in its own child process at one thread (inference mode, cwd
outside the checkout), rounds alternating the forms' order, CPU-time medians over the rounds
(each child: one untimed call, then the median of R calls), every output's largest difference
from REFERENCE's (linpipe's chunked form in float64: not a peer, its time only for scale), and
GFLOP/s of min_flops against batched 64x64 float32 matmuls timed in their own child in every
round.

Inputs as an xLSTM layer makes them: q, k, v ~ N(0, 1) (head size 64: q . k / 8 of unit scale),
input-gate preactivations 15 tanh(x / 15) with x ~ N(-1, 3^2) and forget-gate ones with
x ~ N(3, 1.5^2) (transformers' gate soft cap; forget gates mostly 0.9 to 0.99), from the zero
state, the final state out. Each form gets them in its own layout (transformers' (B, H, T, .)
made before the clock starts) and returns h in the contract's (B, T, H, V) (a view).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OP = "mlstm"
SHAPE = {"B": 1, "T": 16384, "H": 4, "K": 64, "V": 64}
REFERENCE = "linpipe chunk float64"


def make_inputs(shape: dict, seed: int) -> dict:
    import torch

    B, T, H, K, V = (shape[x] for x in ("B", "T", "H", "K", "V"))
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    igate = 15 * torch.tanh((3 * torch.randn(B, T, H, generator=g) - 1) / 15)
    fgate = 15 * torch.tanh((1.5 * torch.randn(B, T, H, generator=g) + 3) / 15)
    heads_first = {f"{name}_bh": x.transpose(1, 2).contiguous()
                   for name, x in (("q", q), ("k", k), ("v", v), ("igate", igate), ("fgate", fgate))}
    return {"q": q, "k": k, "v": v, "igate": igate, "fgate": fgate, **heads_first}


def _linpipe(q, k, v, igate, fgate, **_):
    from linpipe.kernels.mlstm import chunk_mlstm_torch

    return chunk_mlstm_torch(q, k, v, igate, fgate, output_final_state=True)[0]


def _linpipe_float64(q, k, v, igate, fgate, **_):
    """The reference: the chunked form in float64 (the float64 recurrence to 1e-13,
    tests/test_mlstm_kernels.py), which a float32 form's h differs from where n . q nearly
    cancels (at these inputs both float32 forms by 1e-4 to 1e-5 of the largest |h|, ~1100)."""
    from linpipe.kernels.mlstm import chunk_mlstm_torch

    return chunk_mlstm_torch(q.double(), k.double(), v.double(), igate.double(), fgate.double(),
                             output_final_state=True)[0]


def _transformers(q_bh, k_bh, v_bh, igate_bh, fgate_bh, **_):
    from transformers.models.xlstm import modeling_xlstm

    h, _ = modeling_xlstm.mlstm_chunkwise_native_autograd(q_bh, k_bh, v_bh, igate_bh, fgate_bh,
                                                          return_last_states=True, chunk_size=64)
    return h.transpose(1, 2)  # (B, T, H, V)


def _linear_attn(q, k, v, **_):
    """For scale only (not an mLSTM): linpipe's linear attention with the normaliser (elu1, no
    decay) on the same q, k, v, the family this one generalises."""
    from linpipe.kernels import chunk_linear_attn_torch

    return chunk_linear_attn_torch(q, k, v, output_final_state=True)[0]


# forms timed beside the op's own with --context, their outputs not compared
CONTEXT = {"linpipe linear attention (elu1, normaliser)": _linear_attn}

FORMS = {
    "linpipe chunk": _linpipe,
    "transformers mlstm_chunkwise_native_autograd": _transformers,
    REFERENCE: _linpipe_float64,
}


def min_flops(shape: dict, c: int | None = None) -> int:
    """The matmul FLOPs of linpipe's chunked form at its block size c (BLOCK_SIZE, 32), per block
    of c positions and head, as the form computes them: the scores Q K^T (c x K x c, the whole
    square: the causal mask is applied after), each block's state from zero K^T [V | 1]
    (K x c x (V + 1): the normaliser is the ones column), and the fused output [A | Q] [[V | 1];
    [C | n]] (c x (c + K) x (V + 1)). Not counted: the elementwise work (the gates' sums, the
    weighted copies of q and k, the mask, the division), the one multiply-add per block that
    carries the state, and the zero columns that round V + 1 up to a multiple of 8. Only the
    triangles the algebra needs would be 2 c K (c + 1) / 2 ... : 22% fewer at c = 32."""
    if c is None:
        from linpipe.kernels.mlstm import BLOCK_SIZE

        c = BLOCK_SIZE
    T, K, V = shape["T"], shape["K"], shape["V"]
    per_block = 2 * c * K * c + 2 * K * c * (V + 1) + 2 * c * (c + K) * (V + 1)
    return per_block * -(-T // c) * shape["B"] * shape["H"]


CHILD = r"""
import json, statistics, sys, time
import importlib.util
import torch
torch.set_num_threads(1)
path, form, T, repeat, save = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if form == "matmul":
    x, y = torch.randn(256, 64, 64), torch.randn(256, 64, 64)
    call = lambda: [torch.bmm(x, y) for _ in range(50)]
else:
    spec = importlib.util.spec_from_file_location("cpu_forms_mlstm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    inputs = mod.make_inputs(dict(mod.SHAPE, T=T), 0)
    call = lambda: {**mod.FORMS, **mod.CONTEXT}[form](**inputs)
with torch.inference_mode():
    out = call()
    cpu = []
    for _ in range(repeat):
        c = time.process_time()
        call()
        cpu.append(time.process_time() - c)
res = {"cpu_s": statistics.median(cpu)}
if form == "matmul":
    res["gflops"] = 2 * 256 * 64 ** 3 * 50 / res["cpu_s"] / 1e9
elif save:
    torch.save(out.float().contiguous(), save)
print(json.dumps(res))
"""


def _child(form: str, T: int, repeat: int, save: str = "") -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).resolve()), form, str(T), str(repeat),
                        save], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    import torch

    ap = argparse.ArgumentParser(description="the mLSTM's CPU forms at one thread")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--T", type=int, default=SHAPE["T"])
    ap.add_argument("--context", action="store_true", help="also time CONTEXT's forms (not compared)")
    a = ap.parse_args(argv)
    forms = [*FORMS, *(CONTEXT if a.context else ()), "matmul"]
    cpu = {f: [] for f in forms}
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        saved = {f: os.path.join(tmp, f"{i}.pt") for i, f in enumerate(FORMS)}
        for r in range(a.rounds):
            order = forms[r % len(forms):] + forms[:r % len(forms)]
            for f in order if r % 2 == 0 else order[::-1]:
                res = _child(f, a.T, a.repeat, saved.get(f, "") if r == 0 else "")
                cpu[f].append(res["cpu_s"])
                if f == "matmul":
                    rates.append(res["gflops"])
        outs = {f: torch.load(p) for f, p in saved.items()}
    shape = dict(SHAPE, T=a.T)
    flops, rate = min_flops(shape), statistics.median(rates)
    peers = [f for f in FORMS if not f.startswith("linpipe")]
    fastest = min(statistics.median(cpu[f]) for f in peers)
    print(f"{OP}: {shape}, float32, one thread, CPU time, median of {a.rounds} rounds; min_flops "
          f"{flops / 1e9:.3f} GFLOP; batched 64x64 matmul {rate:.1f} GFLOP/s (load {os.getloadavg()[0]:.1f})")
    print("| form | s | range | x fastest peer | GFLOP/s | % matmul | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for f in forms[:-1]:
        s = statistics.median(cpu[f])
        diff = "-"
        if f in FORMS:
            diff = f"{float((outs[f].double() - outs[REFERENCE].double()).abs().max()):.2e}"
        print(f"| {f} | {s:.4f} | {min(cpu[f]):.4f}-{max(cpu[f]):.4f} | {fastest / s:.2f} | "
              f"{flops / s / 1e9:.1f} | {100 * flops / s / 1e9 / rate:.0f} | {diff} |")


if __name__ == "__main__":
    main()
