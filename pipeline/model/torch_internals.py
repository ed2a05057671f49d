"""The one use of a private part of torch in linpipe: oneDNN's float32 matrix product.

Missing public API: a float32 matrix product through oneDNN. torch's public `mm`, `addmm` and
`F.linear` run float32 through MKL's sgemm (oneDNN only for bf16, fp16 or reduced-precision
float32), and MKL runs its AVX2 code on AMD CPUs: 100-110 GFLOP/s on one core of the AMD EPYC
development VM against oneDNN's 215-235 GFLOP/s for the model's shapes, with the same float32
accumulation (BENCHMARKS.md, "The model's fixed cost per call"). `torch.ops.mkldnn._linear_pointwise`
is the operator torch's own compiler (inductor) emits for a linear layer on the CPU; it takes
the dense weight as it is, returns a new dense tensor, and can fuse the exact GELU or a
residual add into the product. Where the operator is missing (a torch built without oneDNN),
`onednn_linear` returns None and the caller uses the public ops.
"""
from __future__ import annotations

import torch

_op = None  # torch.ops.mkldnn._linear_pointwise, once looked up; False where torch lacks it


def _linear_pointwise():
    global _op
    if _op is None:
        try:
            _op = torch.ops.mkldnn._linear_pointwise if torch.backends.mkldnn.is_available() else False
        except (AttributeError, RuntimeError):
            _op = False
    return _op


def onednn_linear(x, w, bias=None, *, gelu=False, residual=None):
    """x (M, K) @ w.T (N, K) (+ bias (N,)), then the exact GELU or + residual (M, N), through
    oneDNN: a new (M, N) tensor. None where oneDNN cannot take it (no operator, not float32 on
    the CPU, or both a GELU and a residual asked for)."""
    op = _linear_pointwise()
    if not op or x.dtype != torch.float32 or w.dtype != torch.float32 or x.device.type != "cpu" \
            or (gelu and residual is not None):
        return None
    if residual is not None:
        return op.binary(x, residual, w, bias, "add")
    return op(x, w, bias, "gelu" if gelu else "none", [], "none" if gelu else "")
