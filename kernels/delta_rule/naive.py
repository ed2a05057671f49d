"""The literal token-by-token delta rule: the reference every faster form is tested against.

Per head, with q_t, k_t L2-normalised by the caller, a write strength beta_t (in (0, 1), or
(0, 2) where negative eigenvalues are allowed) and a log-gate g_t <= 0 (0 for DeltaNet):

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      # (K, V)
    o_t = scale * S_t^T q_t                                                # scale = K^-1/2 by default

Before storing v_t under k_t the head removes what the state already holds there, so it can
overwrite a memory instead of blurring it. There is no normaliser: the state is S alone.
"""
from __future__ import annotations

import torch


def naive_recurrent_delta_rule(
    q: torch.Tensor,  # (B, T, H, K), L2-normalised
    k: torch.Tensor,  # (B, T, H, K), L2-normalised
    v: torch.Tensor,  # (B, T, H, V)
    beta: torch.Tensor,  # (B, T, H)
    *,
    log_gate: torch.Tensor | None = None,  # (B, T, H), g_t <= 0; None: no decay (DeltaNet)
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
    qf, kf, vf, bf = q.to(dtype), k.to(dtype), v.to(dtype), beta.to(dtype)
    S = (q.new_zeros((B, H, K, V), dtype=dtype) if initial_state is None
         else initial_state.to(dtype).clone())
    gates = None if log_gate is None else torch.exp(log_gate.to(dtype))  # (B, T, H)
    o = torch.empty((B, T, H, V), dtype=dtype, device=q.device)
    for t in range(T):
        kt, vt, qt, bt = kf[:, t], vf[:, t], qf[:, t], bf[:, t]  # (B, H, K|V), (B, H)
        if gates is not None:
            S = S * gates[:, t, :, None, None]
        # what the state holds under k_t, replaced by v_t with strength beta_t
        held = torch.einsum("bhk,bhkv->bhv", kt, S)  # (B, H, V)
        S = S + kt.unsqueeze(-1) * (bt.unsqueeze(-1) * (vt - held)).unsqueeze(-2)
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", qt, S)
    final = S.float() if output_final_state else None
    return o.to(q.dtype), final
