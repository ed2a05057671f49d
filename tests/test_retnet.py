"""The retention layer kind (family `retnet`, pipeline/model/retention.py): its rotary angles at
positions far past float32's exact integers, the state carried in the next position's frame
against retention computed at absolute positions, and the import's refusals of fla options it
does not compute. Parity with fla itself: tests/test_fla_import.py (fixtures retnet,
retnet_no_gate)."""
from __future__ import annotations

from decimal import Decimal, getcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _fla_data import assert_refused

from linpipe.model.config import ModelConfig
from linpipe.model.families.retnet.layer import (
    Retention,
    offset_rotations,
    retention_decay,
    rope_angles,
    rope_frequencies,
    rotate,
    turn_state,
)

PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863")


def exact_angle(p: int, f: float) -> float:
    """p * f reduced modulo 2 pi in 60-digit decimals (f: the float64 frequency, exactly)."""
    getcontext().prec = 60
    a = Decimal(p) * Decimal(f)
    return float(a - (a / (2 * PI)).to_integral_value(rounding="ROUND_FLOOR") * 2 * PI)


@pytest.mark.parametrize("p", [2**24 + 3, 3 * 10**9 + 17])
def test_angles_past_2_24_are_the_exact_ones(p):
    """The angle of a position past 2^24 (where float32 holds only even integers) and of a
    whole genome's length, reduced to [0, 2 pi): within float64's rounding of the product (p
    2^-52 radians: 4e-9 at 2^24, below float32's resolution of a sine up to 2^29), where
    float32's product, fla's, is radians off."""
    freq = rope_frequencies(16)
    got = rope_angles(torch.tensor([p]), freq)[0].numpy()
    want = np.array([exact_angle(p, float(f)) for f in freq])
    diff = np.abs(np.angle(np.exp(1j * (got - want))))  # distance on the circle
    assert diff.max() < p * 2.0**-52
    assert ((got >= 0) & (got < 2 * np.pi)).all()
    f32 = (torch.tensor([float(p)], dtype=torch.float32)[:, None] * freq.float())[0].double().numpy()
    assert np.abs(np.angle(np.exp(1j * (f32 - want)))).max() > 1e-3


def _layer(H=2, K=8, V=16, seed=0):
    c = ModelConfig(modality="dna", d_model=16, n_layers=1, n_heads=H, mlp_hidden=8, family="retnet",
                    head_dim=K, expand_v=V / K, use_gate=True, use_short_conv=False)
    torch.manual_seed(seed)
    layer = Retention(c, 2048)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    return layer.eval().requires_grad_(False)


def absolute_retention(layer, a, p0: int):
    """The layer's kernel output (before its norm) and state at absolute positions p0, p0+1, ...
    in float64, the state from zero at p0: retention as fla writes it, with exact angles."""
    T, H, K, V = a.shape[1], layer.n_heads, layer.head_dim, layer.head_v_dim
    x = a[0].double()
    q = (x @ layer.q_proj.weight.double().T).view(T, H, K)
    k = (x @ layer.k_proj.weight.double().T).view(T, H, K)
    v = (x @ layer.v_proj.weight.double().T).view(T, H, V)
    ang = rope_angles(torch.arange(p0, p0 + T), layer.freq)[:, None]  # (T, 1, K/2)
    q, k = rotate(q, ang.cos(), ang.sin()) * K ** -0.5, rotate(k, ang.cos(), ang.sin())
    g = retention_decay(H).double()[:, None, None]
    S, out = torch.zeros(H, K, V, dtype=torch.float64), []
    for t in range(T):
        S = g * S + k[t, :, :, None] * v[t, :, None, :]
        out.append(torch.einsum("hk,hkv->hv", q[t], S))
    return torch.stack(out), S


@pytest.mark.parametrize("p0", [0, 2**24 + 5])
def test_state_in_the_next_positions_frame_gives_absolute_retention(p0):
    """Run in calls cut at odd places, each from the state the last one left, the layer equals
    retention at absolute positions (past 2^24 too) followed by its gated norm, and its state
    is the absolute one turned into the next position's frame, R_(-p) S."""
    layer = _layer()
    a = torch.randn(1, 53, 16)
    want_o, want_S = absolute_retention(layer, a, p0)
    g = (a[0].double() @ layer.g_proj.weight.double().T).view(53, 2, 16)
    w = layer.g_norm.weight.double()
    want = want_o * torch.rsqrt(want_o.pow(2).mean(-1, keepdim=True) + layer.g_norm.eps) * w * F.silu(g)
    # the zero state is the same in every frame: the layer's frame starts at p0
    state, got = {"S": torch.zeros(1, 2, 8, 16)}, []
    with torch.no_grad():
        for s, e in ((0, 1), (1, 20), (20, 21), (21, 53)):
            o, state = layer(a[:, s:e], state)
            got.append(o[0])
    S = state["S"]
    np.testing.assert_allclose(torch.cat(got).view(53, 2, 16).numpy(), want.numpy(), rtol=0, atol=2e-5)
    framed = turn_state(want_S[None], p0 + 53, layer.freq)[0]
    np.testing.assert_allclose(S[0].double().numpy(), framed.numpy(), rtol=0, atol=2e-5)


def test_the_kept_rotations_serve_inference_and_gradients_alike():
    """The cos and sin kept per call length, first made inside a Model's inference_mode, serve
    a later call that computes gradients (an inference tensor cannot be saved for backward), and
    give that call's q and k the same bytes."""
    offset_rotations.cache_clear()
    layer = _layer()
    a = torch.randn(1, 37, 16)
    with torch.inference_mode():
        q, k, _, _ = layer.inputs(a)
    layer.requires_grad_(True)
    q2, k2, _, _ = layer.inputs(a)
    (q2.sum() + k2.sum()).backward()
    assert layer.q_proj.weight.grad is not None and layer.k_proj.weight.grad.abs().sum() > 0
    assert torch.equal(q, q2.detach()) and torch.equal(k, k2.detach())


@pytest.mark.parametrize("changes, message", [
    (dict(feature_map="relu"), "'feature_map' is 'relu': retention with a feature map"),
    (dict(num_kv_heads=3), "'num_kv_heads' is 3 with num_heads 2: grouped key/value heads need a positive"),
    (dict(expand_k=0.53125), "'expand_k' is 0.53125: hidden_size x expand_k must be a whole number"),
    (dict(expand_k=0.3125), "'expand_k' gives heads of 5 key dims"),
    (dict(hidden_act="gelu"), "'hidden_act' is 'gelu'"),
])
def test_retnet_options_not_implemented_are_refused(tmp_path, changes, message):
    assert_refused(tmp_path, "retnet", changes, message)
