"""The literal position-by-position selective scan of Mamba (v1): the reference every faster form
is tested against. mamba_ssm's `selective_scan_ref` in linpipe's position-major layout.

Per channel d and state n, with dt_t = softplus(delta_t + delta_bias) (the bias and the softplus
each optional) and A (D, N) (Mamba's A = -exp(A_log)):

    h_t[d, n] = exp(dt_t[d] A[d, n]) h_{t-1}[d, n] + dt_t[d] u_t[d] B_t[n]
    y_t[d]    = (sum_n C_t[n] h_t[d, n] + D[d] u_t[d]) * silu(z_t[d])    # D and z optional

Each channel is its own head with an N-vector state; B and C are shared by all channels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .stages import check_inputs, time_steps


def naive_selective_scan(u, delta, A, B, C, *, D=None, z=None, delta_bias=None, delta_softplus=False,
                         initial_state=None, output_final_state=False, dtype=torch.float64):
    """u, delta (B, T, D), A (D, N), B, C (B, T, N), D and delta_bias (D,) or None, z (B, T, D) or
    None, initial_state (B, D, N) or None -> (y (B, T, D) in u's dtype, final state (B, D, N)
    float32 or None).

    Computes in `dtype` (float64 by default) so that it can serve as ground truth."""
    check_inputs(u, delta, A, B, C, D, z, delta_bias, initial_state)
    batch, T, Dn = u.shape
    dt = time_steps(delta, delta_bias, delta_softplus, dtype)  # (B, T, D)
    uf, Af, Bf, Cf = u.to(dtype), A.to(dtype), B.to(dtype), C.to(dtype)
    h = u.new_zeros((batch, Dn, A.shape[1]), dtype=dtype)
    if initial_state is not None:
        h = h + initial_state.to(dtype)
    y = u.new_empty((batch, T, Dn), dtype=dtype)
    for t in range(T):
        a = torch.exp(dt[:, t, :, None] * Af)  # (B, D, N)
        h = a * h + (dt[:, t] * uf[:, t])[:, :, None] * Bf[:, t, None, :]
        y[:, t] = (h * Cf[:, t, None, :]).sum(-1)
    if D is not None:
        y = y + uf * D.to(dtype)
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return y.to(u.dtype), (h.float() if output_final_state else None)
