"""The literal token-by-token gated linear attention with a gate per key: the reference every
faster form is tested against.

Per head, with a log-gate vector g_t (K,) <= 0 (flash-linear-attention's GLA `gk`):

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T       # (K, V): row i of the state decays by exp(g_t[i])
    o_t = scale * S_t^T q_t                        # scale = K^-1/2 by default

There is no normaliser: the state is S alone.
"""
from __future__ import annotations

import torch


def naive_recurrent_gla(
    q: torch.Tensor,  # (B, T, H, K)
    k: torch.Tensor,  # (B, T, H, K)
    v: torch.Tensor,  # (B, T, H, V)
    log_gate: torch.Tensor,  # (B, T, H, K), g_t <= 0
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,  # S (B, H, K, V)
    output_final_state: bool = False,
    dtype: torch.dtype = torch.float64,
):
    """Returns (o (B, T, H, V) in q's dtype, final S (B, H, K, V) float32 or None).

    Computes in `dtype` (float64 by default) so that it can serve as ground truth.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    qf, kf, vf = q.to(dtype), k.to(dtype), v.to(dtype)
    decay = torch.exp(log_gate.to(dtype))  # (B, T, H, K)
    S = (q.new_zeros((B, H, K, V), dtype=dtype) if initial_state is None
         else initial_state.to(dtype).clone())
    o = torch.empty((B, T, H, V), dtype=dtype, device=q.device)
    for t in range(T):
        S = S * decay[:, t, :, :, None] + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", qf[:, t], S)
    final = S.float() if output_final_state else None
    return o.to(q.dtype), final
