"""Mamba's selective scan on CUDA through flash-linear-attention's GLA kernels (fla-core, the `gpu`
extra; fla has no kernel of its own for Mamba v1's scan: its Mamba layer calls mamba_ssm's).

The scan is GLA with each channel its own head: H = D heads of K = N keys and V = 1 value, the
query C_t (the same for every head), the key dt_t[d] B_t, the value u_t[d] and the log-gate per
key dt_t[d] A[d, n], scale 1; the state (B, D, N) is GLA's (B, H, K, V) with V = 1. The (B, T,
D, N) operands are made PIECE_ELEMENTS at a time along T, the state carried from piece to piece.
GLA's log-gates must be <= 0: dt A is, for Mamba's A = -exp(A_log) and dt >= 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gla.fla_ops import fla_gla
from .stages import check_inputs, time_steps

# Elements of one (B, piece, D, N) operand: four of them (q, k, g and the output's twin) at 2^26
# float32 elements are 1 GB.
PIECE_ELEMENTS = 1 << 26


def fla_selective_scan(u, delta, A, B, C, *, D=None, z=None, delta_bias=None, delta_softplus=False,
                       initial_state=None, output_final_state=False, form="chunk"):
    """The selective scan through fla's GLA kernel `form` ("chunk" on CUDA; "fused_recurrent",
    which Triton's interpreter runs, for tests). Returns (y (B, T, D) in u's dtype, final state
    (B, D, N) float32 or None), as chunk_selective_scan_torch."""
    check_inputs(u, delta, A, B, C, D, z, delta_bias, initial_state)
    batch, T, Dn = u.shape
    N = A.shape[1]
    dt = time_steps(delta, delta_bias, delta_softplus, torch.float32)  # (B, T, D) float32
    uf, Af = u.float(), A.float()
    h = None if initial_state is None else initial_state.float().unsqueeze(-1)  # (B, D, N, 1)
    piece = max(1, PIECE_ELEMENTS // max(1, batch * Dn * N))
    outs = []
    for s in range(0, T, piece):
        sl = slice(s, s + piece)
        d = dt[:, sl, :, None]  # (B, m, D, 1)
        q = C[:, sl, None, :].float().expand(-1, -1, Dn, -1).contiguous()  # (B, m, D, N)
        k = (d * B[:, sl, None, :].float()).contiguous()
        g = (d * Af).contiguous()
        o, h = fla_gla(q, k, uf[:, sl, :, None].contiguous(), g, scale=1.0, initial_state=h,
                       output_final_state=True, form=form)
        outs.append(o[..., 0])  # (B, m, D)
    y = torch.cat(outs, 1) if outs else uf.new_zeros((batch, 0, Dn))
    if D is not None:
        y = y + uf * D.float()
    if z is not None:
        y = y * F.silu(z.float())
    final = None
    if output_final_state:
        final = (h[..., 0] if h is not None else u.new_zeros((batch, Dn, N), dtype=uf.dtype)).contiguous()
    return y.to(u.dtype), final

