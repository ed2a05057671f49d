"""The network's position-wise ops in CPU inference, on tiles of a fixed number of rows, so that
a position's result never depends on what shares its call.

Measured on the development VM (torch 2.13, MKL 2024.2, oneDNN 3.12): a matrix product gives a
row other bits when it has 1 row (MKL: up to 3 rows) than within a longer product, and with two
threads MKL's rows also differ at 5 and 7; torch's vectorised elementwise loops compute their
last few elements with the scalar function, whose exp2 and erf round differently from the
vector body. So in CPU inference every position-wise op after the causal convolution (the
projections, the MLP and its GELU, the output head and its log-softmax) runs on `tile` rows at
a time: the rows of a call, B records x T positions flattened, in consecutive tiles, the last
one padded with zero rows. Each op then has one shape, whatever the batch or the call's length,
and a tile of a multiple of 32 rows has no scalar remainder. With autograd or on a GPU, `tile`
is None and each op is one ordinary torch op.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from linpipe.model.onednn import cpu_matmul, onednn_linear

# Rows per tile are a multiple of this (32 float32 lanes: AVX-512's two-vector step), so that
# a tile's elementwise ops have no scalar remainder.
ROW_ALIGN = 32


def row_tile(x: torch.Tensor, tile: int) -> int | None:
    """The tile for position-wise ops on x: `tile` rows in CPU inference, None (one op) with
    autograd or on other devices."""
    return tile if x.device.type == "cpu" and not torch.is_grad_enabled() else None


def by_tiles(fn, tile: int, *rows):
    """fn over tiles of exactly `tile` rows of the (N, ...) tensors `rows` (None passes through
    as None): fn(*tile_slices) -> a tensor or a tuple of tensors (tile, ...). The last partial
    tile is padded with zero rows and only its first rows kept. Returns fn's outputs for all N
    rows (fn's own tensors when N == tile)."""
    N = next(r.shape[0] for r in rows if r is not None)
    if N == tile:
        return fn(*rows)
    outs = None
    for a in range(0, max(N, 1), tile):  # no rows: one padded tile, for the outputs' shapes
        n = min(tile, N - a)
        part = [None if r is None else r[a:a + n] for r in rows]
        if n < tile:
            part = [None if r is None else F.pad(r, (0, 0) * (r.dim() - 1) + (0, tile - n)) for r in part]
        got = fn(*part)
        single = isinstance(got, torch.Tensor)
        got = (got,) if single else got
        if outs is None:
            outs = tuple(g.new_empty((N, *g.shape[1:])) for g in got)
        for o, g in zip(outs, got, strict=True):
            o[a:a + n] = g[:n]
    return outs[0] if single else outs


def _linear_tile(x, w, bias, gelu, residual):
    """One tile: x @ w.T (+ bias), then GELU or + residual: oneDNN where this machine's forward
    takes it (`cpu_matmul`) and it takes the tile."""
    y = onednn_linear(x, w, bias, gelu=gelu, residual=residual) if cpu_matmul() == "onednn" else None
    if y is not None:
        return y
    if residual is None:
        y = F.linear(x, w, bias)
    elif bias is None:
        y = torch.addmm(residual, x, w.t())
    else:  # the product and its bias, then the residual: oneDNN's order
        y = F.linear(x, w, bias).add_(residual)
    return torch.ops.aten.gelu_(y) if gelu else y


def map_rows(fn, tile, *rows):
    """fn over the rows (N, ...) of `rows` at once (tile None) or by tiles (`by_tiles`)."""
    return fn(*rows) if tile is None else by_tiles(fn, tile, *rows)


def linear(x, w, *, tile=None, bias=None, gelu=False, residual=None):
    """x (N, K) @ w.T (N_out, K) (+ bias) -> (N, N_out), then the exact GELU (gelu) or +
    residual (N, N_out). tile None: torch's own ops (autograd, GPU); else by tiles (`by_tiles`)."""
    if tile is None:
        if residual is not None:
            return torch.addmm(residual, x, w.t()) if bias is None else residual + F.linear(x, w, bias)
        y = F.linear(x, w, bias)
        return F.gelu(y) if gelu else y
    return by_tiles(lambda xs, rs: _linear_tile(xs, w, bias, gelu, rs), tile, x, residual)
