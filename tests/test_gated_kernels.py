"""Per-position log-gates (flash-linear-attention's simple-GLA gate) in the naive recurrence, the
CPU chunked form and the stages: against the float64 recurrence on awkward shapes, with gates
near -inf and of exactly 0, split and resumed at any cut, over a million positions, a fixed
decay as a constant gate, gradients, and fla's own reference on the same q, k, v, g."""
import math

import pytest
import torch
import torch.nn.functional as F
from _fla_data import fla_naive
from _quick import cells

from linpipe.kernels import chunk_linear_attn, chunk_linear_attn_torch, naive_recurrent_linear_attn
from linpipe.kernels.linear_attn import chunk as chunk_mod

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs(B, T, H, K, V, *, seed, feature_map="elu1", normalize=True, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=torch.float64)
    if feature_map == "identity" and normalize:
        q, k = q.abs() + 0.1, k.abs() + 0.1  # keeps phi(q).z away from 0
    # gates as a gated model makes them, a few heads' worth of strengths: logsigmoid(x) / 4
    gate = F.logsigmoid(torch.randn(B, T, H, generator=g, dtype=torch.float64) * 3 + 1) / 4
    S0 = torch.rand(B, H, K, V, generator=g, dtype=torch.float64) * 2
    z0 = torch.rand(B, H, K, generator=g, dtype=torch.float64) + 1
    return [x.to(dtype) for x in (q, k, v, gate)], (S0.to(dtype), z0.to(dtype))


def _close(a, b, tol):
    assert a.shape == b.shape
    if b.numel() == 0:
        return
    scale = b.abs().max().clamp(min=1.0)
    err = float((a.double() - b.double()).abs().max() / scale)
    assert err <= tol, err


def _reference(q, k, v, gate, init, **kw):
    return naive_recurrent_linear_attn(q.double(), k.double(), v.double(), log_gate=gate.double(),
                                       initial_state=init, output_final_state=True, **kw)


# the quick suite: 1, both sides of 64 and a long one
@pytest.mark.parametrize("T", cells([1, 31, 32, 33, 63, 64, 65, 300], quick=[1, 63, 65, 300]))
@pytest.mark.parametrize("feature_map,normalize", [("elu1", True), ("relu", False), ("identity", True)])
def test_chunked_equals_naive_fp64(T, feature_map, normalize):
    """Every length around the block edges (32 and 64), outputs and final states."""
    (q, k, v, gate), init = _inputs(2, T, 3, 16, 8, seed=T, feature_map=feature_map, normalize=normalize)
    kw = dict(feature_map=feature_map, normalize=normalize)
    o_ref, (S_ref, z_ref) = _reference(q, k, v, gate, init, **kw)
    for block in (32, 64):
        o, (S, z) = chunk_linear_attn_torch(q, k, v, log_gate=gate, initial_state=init,
                                            output_final_state=True, block_size=block, dtype=torch.float64,
                                            **kw)
        _close(o, o_ref, 1e-10)
        _close(S, S_ref, 1e-6)  # final states are float32 in both
        _close(z, z_ref, 1e-6)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_gates_near_minus_infinity_and_zero(dtype, tol):
    """A gate of -1e30 and one of -inf empty the state at their position (nothing overflows or
    turns NaN, in any block or span); gates of exactly 0 keep all of it, over several spans of
    hundreds of blocks, in float64 and float32, through the dispatcher in inference mode too."""
    T = 2 * chunk_mod.SPAN + 77
    (q, k, v, gate), init = _inputs(1, T, 3, 8, 8, seed=1, dtype=dtype)
    gate[0, 5, 0] = -1e30
    gate[0, 40:44, 1] = float("-inf")  # several in one block
    gate[0, 2100, 2] = float("-inf")  # in the second span
    gate[0, :, 2][gate[0, :, 2] > -0.05] = 0.0  # exactly 0 elsewhere: no decay at all there
    gate[0, chunk_mod.SPAN:chunk_mod.SPAN + 200, 0] = 0.0  # a whole stretch of zero gates
    o_ref, (S_ref, z_ref) = _reference(q, k, v, gate, init)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            o, (S, z) = chunk_linear_attn(q, k, v, log_gate=gate, initial_state=init, output_final_state=True)
        assert torch.isfinite(o).all() and torch.isfinite(S).all() and torch.isfinite(z).all()
        _close(o, o_ref, tol)
        _close(S, S_ref, max(tol, 1e-6))
        _close(z, z_ref, max(tol, 1e-6))
    # after a gate of -inf nothing before it counts: the same outputs from a zero state
    o_after, _ = chunk_linear_attn(q[:, 40:], k[:, 40:], v[:, 40:], log_gate=gate[:, 40:])
    _close(o[:, 40:, 1], o_after[:, :, 1], tol)


def test_zero_gates_are_no_decay():
    """Gates of exactly 0 everywhere give the no-decay path's outputs and state."""
    (q, k, v, gate), init = _inputs(1, 300, 2, 16, 16, seed=2)
    a = chunk_linear_attn_torch(q, k, v, log_gate=torch.zeros_like(gate), initial_state=init,
                                output_final_state=True, dtype=torch.float64)
    b = chunk_linear_attn_torch(q, k, v, initial_state=init, output_final_state=True, dtype=torch.float64)
    _close(a[0], b[0], 1e-12)
    _close(a[1][0], b[1][0], 1e-7)


@pytest.mark.parametrize("T", [64, 300, 4097])
def test_fixed_decay_as_a_constant_gate(T):
    """log(decay) at every position is the fixed-decay path, in float32 (both within round-off
    of each other); a decay and a gate together multiply (the dispatcher adds their logs)."""
    (q, k, v, gate), init = _inputs(1, T, 4, 16, 16, seed=T, dtype=torch.float32)
    decay = torch.tensor([1.0, 0.999, 0.99, 0.9])
    const = torch.log(decay).expand(1, T, 4).contiguous()
    with torch.inference_mode():
        a, (Sa, za) = chunk_linear_attn(q, k, v, decay=decay, initial_state=init, output_final_state=True)
        b, (Sb, zb) = chunk_linear_attn(q, k, v, log_gate=const, initial_state=init, output_final_state=True)
    _close(b, a, 2e-6)
    _close(Sb, Sa, 2e-6)
    _close(zb, za, 2e-6)
    o_ref, (S_ref, _) = _reference(q, k, v, gate + const, init)
    o, (S, _) = chunk_linear_attn(q, k, v, decay=decay, log_gate=gate, initial_state=init,
                                  output_final_state=True)
    _close(o, o_ref, 1e-5)
    _close(S, S_ref, 1e-5)


@pytest.mark.parametrize("T", [1, 63, 65, 300])
def test_split_and_resume_at_any_cut(T):
    """[0:T] in one call equals [0:t] then [t:T] with the carried state, in float32, at cuts
    inside and on the edges of blocks."""
    (q, k, v, gate), _ = _inputs(1, T, 2, 16, 16, seed=T, dtype=torch.float32)
    whole, (S, z) = chunk_linear_attn_torch(q, k, v, log_gate=gate, output_final_state=True)
    for t in sorted({0, 1, T // 3, min(32, T), T - 1, T}):
        o1, st = chunk_linear_attn_torch(q[:, :t], k[:, :t], v[:, :t], log_gate=gate[:, :t],
                                         output_final_state=True)
        o2, (S2, z2) = chunk_linear_attn_torch(q[:, t:], k[:, t:], v[:, t:], log_gate=gate[:, t:],
                                               initial_state=st, output_final_state=True)
        _close(torch.cat([o1, o2], 1), whole, 1e-5)
        _close(S2, S, 1e-5)
        _close(z2, z, 1e-5)


def test_packed_records_take_their_own_gates():
    lengths = [5, 64, 130, 1]
    cu = torch.tensor([0] + lengths).cumsum(0)
    (q, k, v, gate), _ = _inputs(1, int(cu[-1]), 2, 8, 8, seed=7)
    g = torch.Generator().manual_seed(3)
    S0 = torch.rand(len(lengths), 2, 8, 8, generator=g, dtype=torch.float64)
    z0 = torch.rand(len(lengths), 2, 8, generator=g, dtype=torch.float64) + 1
    o, (S, z) = chunk_linear_attn(q, k, v, log_gate=gate, initial_state=(S0, z0), output_final_state=True,
                                  cu_seqlens=cu)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        o_ref, (S_ref, _) = _reference(q[:, a:b], k[:, a:b], v[:, a:b], gate[:, a:b],
                                       (S0[i:i + 1], z0[i:i + 1]))
        _close(o[:, a:b], o_ref, 1e-10)
        _close(S[i:i + 1], S_ref, 1e-6)


def test_gradients_match_naive():
    """The chunked form is differentiable in q, k, v and the gates, with the recurrence's
    gradients (training a gated model)."""
    (q, k, v, gate), init = _inputs(1, 70, 2, 8, 8, seed=11)
    grads = []
    for fn in (naive_recurrent_linear_attn, chunk_linear_attn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, gate)]
        o, _ = fn(*leaves[:3], log_gate=leaves[3], initial_state=init)
        (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads, strict=True):
        _close(a, b, 1e-9)
    assert grads[1][3].abs().max() > 1e-3  # the gates do get a gradient


@pytest.mark.parametrize("t", [1, 40, 97])
def test_stages_compose_a_split_sequence(t):
    """The span stages with per-position gates rebuild a sequence cut at t (the split's
    algebra): the first part's local state carried over by its summed gate is the state at t,
    and the second part's parts from zero plus that state's share (cumulative gates from t)
    give the recurrence's outputs and final state."""
    from linpipe.kernels.linear_attn import (
        advance,
        chunk_linear_attn_parts,
        feature_map_fn,
        log_gate_sums,
        span_state,
        state_outputs,
    )

    T, H, K = 130, 2, 16
    (q, k, v, gate), (S0, z0) = _inputs(1, T, H, K, K, seed=t)
    gate[0, t // 2, 0] = float("-inf")
    o_ref, (S_ref, z_ref) = _reference(q, k, v, gate, (S0, z0))
    phi = feature_map_fn("elu1")
    dS, dz = span_state(phi(k[0, :t]), v[0, :t], log_gate=gate[0, :t])
    S, z = advance(S0[0], z0[0], dS, dz, log_total=log_gate_sums(gate[0, :t])[-1])
    zero = (torch.zeros(1, H, K, K, dtype=torch.float64), torch.zeros(1, H, K, dtype=torch.float64))
    num, den, (S2, z2) = chunk_linear_attn_parts(q[:, t:], k[:, t:], v[:, t:], log_gate=gate[:, t:],
                                                 initial_state=zero)
    n_in, d_in = state_outputs(phi(q[0, t:]), S, z, log_cum=log_gate_sums(gate[0, t:]))
    _close((num[0] + n_in) / (den[0] + d_in + 1e-6).unsqueeze(-1), o_ref[0, t:], 1e-10)
    S_end, z_end = advance(S, z, S2[0], z2[0], log_total=log_gate_sums(gate[0, t:])[-1])
    _close(S_end, S_ref[0].double(), 1e-6)
    _close(z_end, z_ref[0].double(), 1e-6)


def test_bad_gates_are_refused():
    (q, k, v, gate), _ = _inputs(1, 10, 2, 8, 8, seed=0)
    with pytest.raises(ValueError, match="<= 0"):
        chunk_linear_attn(q, k, v, log_gate=gate + 0.5)
    with pytest.raises(ValueError, match="shape"):
        chunk_linear_attn(q, k, v, log_gate=gate[:, :5])


@pytest.mark.slow  # a million positions, float32 in 16 calls and float64 in one
def test_million_positions_in_16_calls_vs_float64():
    """1,000,000 positions in 16 float32 calls carrying the state equal the float64 chunked form
    in one call (float32 chunked form, gates of every strength, heads of short and long memory).
    The float64 chunked form is anchored to the float64 recurrence on the first 30,000 positions
    here (three memory spans of head 0), and on every awkward shape above; the recurrence over
    all of it would be a million Python steps (a minute on the CI machine)."""
    T, H, K, head = 1_000_000, 2, 8, 30_000
    g = torch.Generator().manual_seed(5)  # float32 draws: float64 ones took a fifth of the time
    q, k, v = (torch.randn(1, T, H, K, generator=g) for _ in range(3))
    g = torch.Generator().manual_seed(6)
    # head 0 keeps ~1 - 1e-4 per position (its memory spans ~10^4), head 1 ~0.8, both varying
    gate = torch.stack([F.logsigmoid(torch.randn(T, generator=g) + 9.0),
                        F.logsigmoid(torch.randn(T, generator=g) + 1.5)], -1)[None].float()
    with torch.inference_mode():
        o_ref, (S_ref, z_ref) = chunk_linear_attn_torch(q.double(), k.double(), v.double(),
                                                        log_gate=gate.double(), output_final_state=True)
        o_rec, _ = naive_recurrent_linear_attn(q[:, :head].double(), k[:, :head].double(),
                                               v[:, :head].double(), log_gate=gate[:, :head].double())
        _close(o_ref[:, :head], o_rec, 1e-10)
        state, parts = None, []
        step = math.ceil(T / 16)
        for a in range(0, T, step):
            o, state = chunk_linear_attn(q[:, a:a + step], k[:, a:a + step], v[:, a:a + step],
                                         log_gate=gate[:, a:a + step], initial_state=state,
                                         output_final_state=True)
            parts.append(o)
    assert o_ref.dtype == torch.float64
    _close(torch.cat(parts, 1), o_ref, 1e-5)
    _close(state[0], S_ref, 1e-5)
    _close(state[1], z_ref, 1e-5)


@pytest.mark.parametrize("T", [1, 63, 65, 300])
def test_matches_flash_linear_attention_simple_gla(T):
    """fla's naive simple-GLA (recurrent and chunked) and ours on the same q, k, v, g: identity
    features, no normaliser, q scaled by K^-0.5 as fla scales it, an initial state in and the
    final state out. A simple-GLA layer trained with fla computes the same thing here."""
    fla = fla_naive("simple_gla")
    B, H, K, V = 2, 3, 16, 32
    g = torch.Generator().manual_seed(T)
    q, k = (torch.randn(B, T, H, K, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    gate = F.logsigmoid(torch.randn(B, T, H, generator=g)) / 16  # fla's layer: logsigmoid(gk) / 16
    S0 = torch.randn(B, H, K, V, generator=g)
    scale = K ** -0.5
    want, S_want = fla.naive_recurrent_simple_gla(q, k, v, gate, scale=scale, initial_state=S0.clone(),
                                                  output_final_state=True)
    want_chunk, S_chunk = fla.naive_chunk_simple_gla(q, k, v, gate, initial_state=S0.clone(),
                                                     output_final_state=True, scale=scale)
    init = (S0, torch.zeros(B, H, K))
    kw = dict(log_gate=gate, feature_map="identity", normalize=False, initial_state=init,
              output_final_state=True)
    for fn in (naive_recurrent_linear_attn, chunk_linear_attn):
        o, (S, _) = fn(q * scale, k, v, **kw)
        for ref, S_ref in ((want, S_want), (want_chunk, S_chunk)):
            _close(o, ref, 1e-5)
            _close(S, S_ref, 1e-5)
