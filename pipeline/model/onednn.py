"""oneDNN's float32 matrix product on the CPU, through torch's public oneDNN tensors, and which
of it and torch's own product (MKL's sgemm) the CPU forward uses on this machine.

MKL runs its AVX2 code on AMD CPUs. On an AMD EPYC with AVX-512, oneDNN's product ran the
model's shapes at 215-235 GFLOP/s on one core against MKL's 100-110; on an AMD EPYC with AVX2
only, oneDNN's AVX2 kernel and its copies in and out ran the default and bench models' shapes
at 15-72 GFLOP/s against MKL's 57-71, and the whole forward was 1.1-1.4x faster through MKL
(BENCHMARKS.md, "The CPU forward" and "The matmul backend by CPU"). So the forward takes oneDNN
where torch's CPU capability is AVX-512 and MKL elsewhere: a rule of the machine, not a timing,
because the two round differently and a machine must give the same bytes on every run.
`LINPIPE_CPU_MATMUL=mkl` or `onednn` overrides the rule, e.g. on every node of a cluster of
mixed CPUs, so that all its workers take the same product.

`Tensor.to_mkldnn` and the `aten.mkldnn_linear` operator reach oneDNN without any private part
of torch; the GELU and the residual add follow as ordinary ops (fusing them into the product
needs a private operator, which gave the same bytes, 1.1x faster).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from linpipe.errors import LinpipeError

MATMULS = ("mkl", "onednn")
MATMUL_ENV = "LINPIPE_CPU_MATMUL"
_available = None  # whether this torch has oneDNN, once asked
_chosen = None  # the forward's product on this machine, once decided


def _has_onednn() -> bool:
    global _available
    if _available is None:
        _available = bool(torch.backends.mkldnn.is_available())
    return _available


def matmul_asked(value: str, where: str = MATMUL_ENV) -> str | None:
    """The product a LINPIPE_CPU_MATMUL value asks for, None for an empty one; where: how the
    user gave it, for the error."""
    asked = value.strip().lower()
    if asked and asked not in MATMULS:
        raise LinpipeError(f"{where}={value!r}: use one of {', '.join(MATMULS)}, or unset it (the "
                           "machine's own choice)")
    return asked or None


def cpu_matmul() -> str:
    """The float32 product the CPU forward's row tiles use here: "onednn" where torch runs
    AVX-512 code and has oneDNN, else "mkl" (torch's own op); `LINPIPE_CPU_MATMUL` overrides."""
    global _chosen
    if _chosen is None:
        asked = matmul_asked(os.environ.get(MATMUL_ENV, ""))
        if asked is None:
            avx512 = torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512")
            asked = "onednn" if avx512 and _has_onednn() else "mkl"
        elif asked == "onednn" and not _has_onednn():
            raise LinpipeError(f"{MATMUL_ENV}=onednn: this torch has no oneDNN "
                               "(torch.backends.mkldnn.is_available() is False); use mkl, or unset it")
        _chosen = asked
    return _chosen


def onednn_linear(x, w, bias=None, *, gelu=False, residual=None):
    """x (M, K) @ w.T (N, K) (+ bias (N,)), then the exact GELU or + residual (M, N), the product
    through oneDNN: a new (M, N) tensor. None where oneDNN cannot take it (no oneDNN, not
    float32 on the CPU, or both a GELU and a residual asked for)."""
    if not _has_onednn() or x.dtype != torch.float32 or w.dtype != torch.float32 \
            or x.device.type != "cpu" or (gelu and residual is not None):
        return None
    y = torch.ops.aten.mkldnn_linear(x.contiguous().to_mkldnn(), w, bias).to_dense()
    if residual is not None:
        y += residual
    return F.gelu(y) if gelu else y
