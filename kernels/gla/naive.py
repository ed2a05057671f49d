"""The literal token-by-token gated linear attention with a gate per key: the reference every
faster form is tested against.

Per head, with a log-gate vector g_t (K,) <= 0 (flash-linear-attention's GLA `gk`):

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T       # (K, V): row i of the state decays by exp(g_t[i])
    o_t = scale * S_t^T q_t                        # scale = K^-1/2 by default

There is no normaliser: the state is S alone.
"""
from __future__ import annotations

import torch


def naive_recurrent_gla(q, k, v, log_gate, *, scale=None, initial_state=None, output_final_state=False,
                        dtype=torch.float64):
    """q, k (B, T, H, K), v (B, T, H, V), log_gate (B, T, H, K) <= 0, initial_state S (B, H, K, V)
    or None -> (o (B, T, H, V) in q's dtype, final S (B, H, K, V) float32 or None).

    Computes in `dtype` (float64 by default) so that it can serve as ground truth.
    """
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    qf, kf, vf = q.to(dtype), k.to(dtype), v.to(dtype)
    decay = torch.exp(log_gate.to(dtype))  # (B, T, H, K)
    S = q.new_zeros((B, H, K, v.shape[-1]), dtype=dtype)
    if initial_state is not None:
        S = S + initial_state.to(dtype)
    o = torch.empty(v.shape, dtype=dtype, device=q.device)
    for t in range(T):
        S = S * decay[:, t, :, :, None] + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", qf[:, t], S)
    final = S.float() if output_final_state else None
    return o.to(q.dtype), final
