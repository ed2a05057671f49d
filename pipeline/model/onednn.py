"""oneDNN's float32 matrix product on the CPU, through torch's public oneDNN tensors.

torch's `mm`, `addmm` and `F.linear` run float32 through MKL's sgemm, and MKL runs its AVX2 code
on AMD CPUs: 100-110 GFLOP/s on one core of the AMD EPYC development VM against oneDNN's
215-235 GFLOP/s for the model's shapes, with the same float32 accumulation (BENCHMARKS.md, "The
CPU forward"). `Tensor.to_mkldnn` and the `aten.mkldnn_linear` operator reach oneDNN without
any private part of torch; the GELU and the residual add follow as ordinary ops (fusing them
into the product needs a private operator, which gave the same bytes, 1.1x faster). Where torch
has no oneDNN, `onednn_linear` returns None and the caller uses MKL.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_available = None  # whether this torch has oneDNN, once asked


def _has_onednn() -> bool:
    global _available
    if _available is None:
        _available = bool(torch.backends.mkldnn.is_available())
    return _available


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
