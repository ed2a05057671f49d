"""Gated linear attention with a gate per key (linpipe.kernels.gla): the CPU chunked form
against the float64 recurrence on awkward lengths around the block edges, final states, a
sequence split and resumed at any cut, gates of exactly 0 and strongly negative ones (a key's
state emptied within a block: the explicit path), gradients, and flash-linear-attention's own
naive GLA on the same inputs."""
import pytest
import torch
import torch.nn.functional as F
from _fla_data import fla_naive
from _quick import cells

from linpipe.kernels.gla import chunk as chunk_mod
from linpipe.kernels.gla import chunk_gla_torch, gla, naive_recurrent_gla

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs(B, T, H, K, V, *, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=torch.float64)
    # per-key gates as GLA makes them, of several strengths: logsigmoid(x) / 4
    gate = F.logsigmoid(torch.randn(B, T, H, K, generator=g, dtype=torch.float64) * 3 + 1) / 4
    S0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, gate)], S0.to(dtype)


def _close(a, b, tol):
    """Max error relative to the largest reference magnitude (at least 1)."""
    assert a.shape == b.shape
    scale = b.abs().max().clamp(min=1.0) if b.numel() else 1.0
    err = float((a.double() - b.double()).abs().max() / scale) if b.numel() else 0.0
    assert err <= tol, err


def _reference(q, k, v, gate, S0, **kw):
    return naive_recurrent_gla(q.double(), k.double(), v.double(), gate.double(), initial_state=S0,
                               output_final_state=True, **kw)


# the quick suite: 1, both sides of 64 and a long one
@pytest.mark.parametrize("T", cells([1, 15, 16, 17, 63, 65, 300], quick=[1, 63, 65, 300]))
def test_chunked_equals_naive_fp64(T):
    """Every length around the block edges (16, 32, 64), outputs and final states, K != V."""
    (q, k, v, gate), S0 = _inputs(2, T, 3, 16, 8, seed=T)
    o_ref, S_ref = _reference(q, k, v, gate, S0)
    for block in (16, 32, 64):
        o, S = chunk_gla_torch(q, k, v, gate, initial_state=S0, output_final_state=True, block_size=block)
        assert o.dtype == torch.float64 and S.dtype == torch.float32
        _close(o, o_ref, 1e-12)
        _close(S, S_ref, 1e-6)  # final states are float32 in both
    o, S = chunk_gla_torch(q.float(), k.float(), v.float(), gate.float(), initial_state=S0.float(),
                           output_final_state=True)
    _close(o, o_ref, 1e-5)
    _close(S, S_ref, 1e-5)


def test_without_initial_state_and_scale():
    (q, k, v, gate), _ = _inputs(1, 40, 2, 8, 8, seed=1)
    o, S = chunk_gla_torch(q, k, v, gate, scale=0.3)
    o_ref, _ = naive_recurrent_gla(q, k, v, gate, scale=0.3)
    assert S is None
    _close(o, o_ref, 1e-12)


@pytest.mark.parametrize("cuts", [(1,), (17,), (32, 33), (5, 100, 101, 250)])
def test_split_and_resumed_at_any_cut(cuts):
    """Calls that carry the final state as the next one's initial state give one call's outputs
    and final state, wherever the cuts fall (inside blocks, on their edges)."""
    (q, k, v, gate), S0 = _inputs(1, 300, 2, 16, 16, seed=7)
    o_one, S_one = chunk_gla_torch(q, k, v, gate, initial_state=S0, output_final_state=True,
                                   dtype=torch.float64)
    edges = [0, *cuts, 300]
    S, outs = S0, []
    for a, b in zip(edges, edges[1:], strict=False):
        o, S = chunk_gla_torch(q[:, a:b], k[:, a:b], v[:, a:b], gate[:, a:b], initial_state=S,
                               output_final_state=True, dtype=torch.float64)
        S = S.double()  # carried as the contract's float32
        outs.append(o)
    _close(torch.cat(outs, 1), o_one, 1e-6)
    _close(S, S_one, 1e-6)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_gates_of_zero_and_strongly_negative(dtype, tol):
    """Gates of -inf, -1e30 and of sums past -FACTOR_MAX within a block (a key's state emptied:
    the explicit path) make no inf or NaN in any block or span; gates of exactly 0 keep all of
    a key's state, over several spans."""
    T = 2 * chunk_mod.SPAN + 77
    (q, k, v, gate), S0 = _inputs(1, T, 2, 8, 8, seed=3, dtype=dtype)
    gate[0, 5, 0, 0] = -1e30
    gate[0, 40:44, 1, :3] = float("-inf")
    gate[0, 2100:2140, 0, 2:5] = -5.0  # 40 x -5 = -200 over one block: strong keys
    gate[0, 3000:3300, 1, 6] = -2.5  # -80 a block of 32, every block of a stretch
    gate[0, :, :, 7] = 0.0  # one key that never decays
    gate[0, chunk_mod.SPAN:chunk_mod.SPAN + 200] = 0.0  # a stretch of zero gates for every key
    o_ref, S_ref = _reference(q, k, v, gate, S0)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            o, S = gla(q, k, v, gate, initial_state=S0, output_final_state=True)
        assert torch.isfinite(o).all() and torch.isfinite(S).all()
        _close(o, o_ref, tol)
        _close(S, S_ref, max(tol, 1e-6))


def test_gradients_equal_the_recurrences():
    """Gradients of every input (the gate's too, strong keys included) and the initial state."""
    (q, k, v, gate), S0 = _inputs(1, 70, 2, 8, 4, seed=5)
    gate[0, 10:50, 1, :2] = -3.0  # strong keys in a block: their explicit path's backward
    leaves = [x.clone().requires_grad_() for x in (q, k, v, gate, S0)]
    o, S = chunk_gla_torch(*leaves[:4], initial_state=leaves[4], output_final_state=True)
    got = torch.autograd.grad(o.square().sum() + S.double().sum(), leaves)
    lv = [x.detach().clone().requires_grad_() for x in leaves]
    o_ref, _ = naive_recurrent_gla(*lv[:4], initial_state=lv[4])
    want = torch.autograd.grad(o_ref.square().sum() + _final_state_fp64(*lv).sum(), lv)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        _close(a, b, 1e-9)


def _final_state_fp64(q, k, v, gate, S0):
    """The recurrence's final state, differentiable (the contract returns it in float32)."""
    S = S0
    for t in range(q.shape[1]):
        S = S * gate[:, t].exp()[..., None] + k[:, t, :, :, None] * v[:, t, :, None, :]
    return S


def test_bad_shapes_and_positive_gates_are_refused():
    (q, k, v, gate), _ = _inputs(1, 5, 2, 8, 8, seed=0)
    with pytest.raises(ValueError, match="log_gate must have shape"):
        chunk_gla_torch(q, k, v, gate[..., 0])
    with pytest.raises(ValueError, match="<= 0 everywhere"):
        chunk_gla_torch(q, k, v, gate.abs() + 0.1)


def test_flas_naive_gla_agrees():
    """fla's own naive GLA (fla.ops.gla.naive, float32) on the same inputs: same layout, scale
    and state (B, H, K, V)."""
    fla_naive_gla = fla_naive("gla").naive_recurrent_gla

    (q, k, v, gate), S0 = _inputs(2, 70, 2, 16, 8, seed=9, dtype=torch.float32)
    o_fla, S_fla = fla_naive_gla(q, k, v, gate, initial_state=S0, output_final_state=True)
    o, S = chunk_gla_torch(q, k, v, gate, initial_state=S0, output_final_state=True)
    _close(o, o_fla, 1e-5)
    _close(S, S_fla, 1e-5)
