"""The literal token-by-token Kimi Delta Attention (KDA): the reference every faster form is
tested against.

Per value head h, with q_t, k_t L2-normalised by the caller (the query/key head h // G when the
H query/key heads serve HV = G H value heads), a write strength beta_t and a log-gate vector
g_t (K,) <= 0 (one decay per key channel, per value head):

    S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T      # (K, V)
    o_t = scale S_t^T q_t                                                        # scale = K^-1/2 by default

The state first forgets (each key channel's row by its own gate), then the head removes what
the decayed state holds under k_t and writes v_t there with strength beta_t. With one gate per
position (g_t the same in every channel) this is the gated delta rule (linpipe.kernels.delta_rule).
"""
from __future__ import annotations

import torch


def naive_recurrent_kda(
    q: torch.Tensor,  # (B, T, H, K), L2-normalised
    k: torch.Tensor,  # (B, T, H, K), L2-normalised
    v: torch.Tensor,  # (B, T, HV, V), HV a multiple of H
    beta: torch.Tensor,  # (B, T, HV)
    *,
    log_gate: torch.Tensor,  # (B, T, HV, K), g_t <= 0
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,  # S (B, HV, K, V)
    output_final_state: bool = False,
    dtype: torch.dtype = torch.float64,
):
    """Returns (o (B, T, HV, V) in q's dtype, final S (B, HV, K, V) float32 or None).

    Computes in `dtype` (float64 by default) so that it can serve as ground truth.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    scale = K ** -0.5 if scale is None else scale
    # value head h reads query/key head h // G (fla's repeat_interleave)
    qf, kf = (x.to(dtype).repeat_interleave(G, dim=2) for x in (q, k))  # (B, T, HV, K)
    vf, bf = v.to(dtype), beta.to(dtype)
    decay = torch.exp(log_gate.to(dtype))  # (B, T, HV, K)
    S = (q.new_zeros((B, HV, K, V), dtype=dtype) if initial_state is None
         else initial_state.to(dtype).clone())
    o = torch.empty((B, T, HV, V), dtype=dtype, device=q.device)
    for t in range(T):
        kt, vt, qt, bt = kf[:, t], vf[:, t], qf[:, t], bf[:, t]  # (B, HV, K|V), (B, HV)
        S = S * decay[:, t, :, :, None]  # key channel i's row decays by exp(g_t[i])
        # what the decayed state holds under k_t, replaced by v_t with strength beta_t
        held = torch.einsum("bhk,bhkv->bhv", kt, S)  # (B, HV, V)
        S = S + kt.unsqueeze(-1) * (bt.unsqueeze(-1) * (vt - held)).unsqueeze(-2)
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", qt, S)
    final = S.float() if output_final_state else None
    return o.to(q.dtype), final
