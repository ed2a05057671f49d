"""The literal token-by-token mLSTM (xLSTM's matrix memory): the reference every faster form is
tested against.

Per head, with an input-gate preactivation i_t (the input gate is exp(i_t)), a forget-gate
preactivation f_t (the forget gate is sigmoid(f_t), taken in log space as logsigmoid(f_t)) and
scale = K^-1/2 by default, the state is a matrix memory C (K, V), a normaliser n (K,) and a
stabiliser m (a scalar), both C and n held divided by exp(m):

    m_t = max(logsigmoid(f_t) + m_{t-1}, i_t)
    C_t = exp(logsigmoid(f_t) + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T
    n_t = exp(logsigmoid(f_t) + m_{t-1} - m_t) n_{t-1} + exp(i_t - m_t) k_t
    h_t = scale C_t^T q_t / (max(|scale n_t . q_t|, exp(-m_t)) + eps)

transformers' xLSTM (`mlstm_recurrent_step_native`) and the xlstm package take the same gates
and the same eps (1e-6, added after the max). A record starts from C = 0, n = 0, m = 0, their
zero state; m = -inf is the empty state (the parallel form of the original xLSTM code, whose
stabiliser has no such 0 term): m_t is then i_t at the first position.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def naive_recurrent_mlstm(
    q: torch.Tensor,  # (B, T, H, K)
    k: torch.Tensor,  # (B, T, H, K)
    v: torch.Tensor,  # (B, T, H, V)
    igate: torch.Tensor,  # (B, T, H) input-gate preactivations (the log of the input gate)
    fgate: torch.Tensor,  # (B, T, H) forget-gate preactivations (logsigmoid gives the log gate)
    *,
    scale: float | None = None,
    eps: float = 1e-6,
    # C (B, H, K, V), n (B, H, K), m (B, H)
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    dtype: torch.dtype = torch.float64,
):
    """Returns (h (B, T, H, V) in q's dtype, final state (C, n, m) float32 or None).

    Computes in `dtype` (float64 by default) so that it can serve as ground truth.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    qf, kf, vf = q.to(dtype) * scale, k.to(dtype), v.to(dtype)
    ig, lf = igate.to(dtype), F.logsigmoid(fgate.to(dtype))  # (B, T, H)
    if initial_state is None:
        C = q.new_zeros((B, H, K, V), dtype=dtype)
        n = q.new_zeros((B, H, K), dtype=dtype)
        m = q.new_zeros((B, H), dtype=dtype)
    else:
        C, n, m = (x.to(dtype).clone() for x in initial_state)
    h = torch.empty((B, T, H, V), dtype=dtype, device=q.device)
    for t in range(T):
        m_new = torch.maximum(lf[:, t] + m, ig[:, t])  # (B, H)
        decay = torch.exp(lf[:, t] + m - m_new)  # 0 where m was -inf
        write = torch.exp(ig[:, t] - m_new)
        C = decay[..., None, None] * C + write[..., None, None] * kf[:, t, :, :, None] * vf[:, t, :, None, :]
        n = decay[..., None] * n + write[..., None] * kf[:, t]
        m = m_new
        num = torch.einsum("bhk,bhkv->bhv", qf[:, t], C)
        den = (qf[:, t] * n).sum(-1)  # (B, H)
        h[:, t] = num / (torch.maximum(den.abs(), torch.exp(-m)) + eps)[..., None]
    final = (C.float(), n.float(), m.float()) if output_final_state else None
    return h.to(q.dtype), final
