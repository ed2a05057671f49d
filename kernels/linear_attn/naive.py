"""The literal token-by-token recurrence of causal linear attention: the reference every
faster form (PyTorch chunked, Triton) is tested against.

Per head h with decay gamma_h (1 when decay is None) and, with per-position log-gates g_t
(flash-linear-attention's simple-GLA gate; 0 when log_gate is None), a_t = gamma exp(g_t):
    S_t = a_t S_{t-1} + phi(k_t) v_t^T        # (K, V)
    z_t = a_t z_{t-1} + phi(k_t)              # (K,)
    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t + eps)   if normalize, else phi(q_t)^T S_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

FEATURE_MAPS = ("elu1", "relu", "identity")


def feature_map_fn(name: str):
    """phi as a torch function."""
    if name == "elu1":
        return lambda x: F.elu(x) + 1.0
    if name == "relu":
        return F.relu
    if name == "identity":
        return lambda x: x
    raise ValueError(f"unknown feature map {name!r}; expected one of {', '.join(FEATURE_MAPS)}")


def naive_recurrent_linear_attn(
    q: torch.Tensor,  # (B, T, H, K) raw projections; phi is applied here
    k: torch.Tensor,  # (B, T, H, K)
    v: torch.Tensor,  # (B, T, H, V)
    *,
    decay: torch.Tensor | None = None,  # (H,) in (0, 1]
    feature_map: str = "elu1",
    normalize: bool = True,
    eps: float = 1e-6,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,  # S (B, H, K, V), z (B, H, K)
    output_final_state: bool = False,
    dtype: torch.dtype = torch.float64,
    log_gate: torch.Tensor | None = None,  # (B, T, H) log-gates g_t <= 0 of the positions
):
    """Returns (o (B, T, H, V) in q's dtype, final_state (S, z) in float32 or None).

    Computes in `dtype` (float64 by default) so that it can serve as ground truth.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    phi = feature_map_fn(feature_map)
    qf, kf, vf = phi(q.to(dtype)), phi(k.to(dtype)), v.to(dtype)
    if initial_state is None:
        S = q.new_zeros((B, H, K, V), dtype=dtype)
        z = q.new_zeros((B, H, K), dtype=dtype)
    else:
        S, z = initial_state[0].to(dtype).clone(), initial_state[1].to(dtype).clone()
    g = None if decay is None else decay.to(dtype).view(1, H, 1)
    gates = None if log_gate is None else torch.exp(log_gate.to(dtype)).unsqueeze(-1)  # (B, T, H, 1)
    o = torch.empty((B, T, H, V), dtype=dtype, device=q.device)
    for t in range(T):
        kt, vt, qt = kf[:, t], vf[:, t], qf[:, t]  # (B, H, K), (B, H, V), (B, H, K)
        if g is not None:
            S = S * g.unsqueeze(-1)
            z = z * g
        if gates is not None:
            S = S * gates[:, t].unsqueeze(-1)
            z = z * gates[:, t]
        S = S + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        z = z + kt
        num = torch.einsum("bhk,bhkv->bhv", qt, S)
        if normalize:
            num = num / ((qt * z).sum(-1, keepdim=True) + eps)
        o[:, t] = num
    final = (S.float(), z.float()) if output_final_state else None
    return o.to(q.dtype), final
