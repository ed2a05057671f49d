"""The chunked form of Mamba's selective scan in PyTorch (the CPU, and autograd anywhere). Same
contract as naive.py.

The sequence streams through in spans carrying the state (stages.span_positions: as many
positions as keep a span's temporaries near 2 MB); in a span, every
block of c rows runs its local scan from a zero state at once (one op per row over all blocks),
the blocks are carried in order, and every output follows at once (stages.run_span). No Python
loop over positions; plain autograd gives the backward (the ops are out of place when a gradient
is needed, in reused buffers otherwise).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .stages import BLOCK_SIZE, check_inputs, scan


def chunk_selective_scan_torch(u, delta, A, B, C, *, D=None, z=None, delta_bias=None, delta_softplus=False,
                               initial_state=None, output_final_state=False, block_size: int = BLOCK_SIZE,
                               span: int | None = None, dtype: torch.dtype | None = None):
    """naive_selective_scan's contract: u, delta (B, T, D), A (D, N), B, C (B, T, N), D and
    delta_bias (D,), z (B, T, D), the state (B, D, N). Returns (y (B, T, D) in u's dtype, final
    state (B, D, N) float32 or None).

    Computes in float32 (float64 for float64 inputs, or `dtype` when given). Differentiable."""
    check_inputs(u, delta, A, B, C, D, z, delta_bias, initial_state)
    o, h, _ = scan(u, delta, A, B, C, D=D, delta_bias=delta_bias, delta_softplus=delta_softplus,
                   h=initial_state, block_size=block_size, span=span, dtype=dtype)
    if z is not None:
        o = o * F.silu(z.to(o.dtype))
    final = h.float().contiguous() if output_final_state else None
    return o.to(u.dtype if dtype is None else o.dtype), final
