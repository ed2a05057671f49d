"""The delta rule's chunked form and stages (linpipe.kernels.delta_rule) against the float64
recurrence: awkward shapes around the blocks' edges, final states, split and resumed at any cut,
the stages' summaries folded at any cut, a million positions in 16 calls, beta = 0, gates of
exactly 0 and near -inf, gradients, and flash-linear-attention's own naive references."""
import math

import pytest
import torch
import torch.nn.functional as F
from _fla_data import fla_naive
from _quick import cells

from linpipe.kernels.delta_rule import (
    advance,
    chunk_delta_rule_torch,
    delta_rule,
    fold_summaries,
    naive_recurrent_delta_rule,
    span_parts,
    span_summary,
    state_share,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs(B, T, H, K, V, *, seed, dtype=torch.float64, gated=True):
    """q, k L2-normalised as a layer makes them, beta in (0, 1), gates logsigmoid(x) / 4 (a few
    heads' worth of strengths), and an entering state."""
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g, dtype=torch.float64))
    gate = F.logsigmoid(torch.randn(B, T, H, generator=g, dtype=torch.float64) * 3 + 1) / 4 if gated else None
    S0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64)
    cast = [x if x is None else x.to(dtype) for x in (q, k, v, beta, gate)]
    return cast, S0.to(dtype)


def _close(a, b, tol):
    """Max error relative to the reference's largest magnitude (at least 1)."""
    assert a.shape == b.shape and b.numel()
    err = float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1.0))
    assert err <= tol, err


def _reference(q, k, v, beta, gate, S0, **kw):
    return naive_recurrent_delta_rule(q.double(), k.double(), v.double(), beta.double(),
                                      log_gate=None if gate is None else gate.double(),
                                      initial_state=S0, output_final_state=True, **kw)


def _cut(x, a, b):
    return None if x is None else x[:, a:b]


# the quick suite: 1, both sides of 64 (a multiple of both blocks) and a long one
@pytest.mark.parametrize("T", cells([1, 15, 16, 17, 31, 32, 33, 63, 65, 300], quick=[1, 63, 65, 300]))
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("block_size", [16, 32])
def test_chunked_equals_naive_fp64(T, gated, block_size):
    """Every length around the blocks' edges (16, 32 = BLOCK_SIZE), outputs and final states."""
    (q, k, v, beta, gate), S0 = _inputs(2, T, 3, 16, 8, seed=T, gated=gated)
    o, S = chunk_delta_rule_torch(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True,
                                  block_size=block_size)
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0)
    assert o.dtype == torch.float64 and S.dtype == torch.float32
    _close(o, o_ref, 1e-12)
    _close(S, S_ref, 1e-6)  # S is float32 in the contract
    _, S64 = chunk_delta_rule_torch(q, k, v, beta, log_gate=gate, initial_state=S0, block_size=block_size,
                                    dtype=torch.float64, output_final_state=True)
    _close(S64, S_ref, 1e-6)


@pytest.mark.parametrize("gated", [False, True])
def test_float32_within_1e5_of_fp64(gated):
    """The contract's float32 compute over several spans (SPAN 2048) against the float64 recurrence."""
    (q, k, v, beta, gate), S0 = _inputs(1, 4500, 2, 32, 16, seed=3, dtype=torch.float32, gated=gated)
    o, S = delta_rule(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0.double())
    assert o.dtype == torch.float32
    _close(o, o_ref, 1e-5)
    _close(S, S_ref, 1e-5)


@pytest.mark.parametrize("cuts", [(1,), (63,), (64, 65), (17, 100, 199), (129, 130, 131)])
def test_split_and_resumed_at_any_cut(cuts):
    """Calls cut anywhere, each resumed from the last one's final state, equal one call (to the
    float32 round-off of the state handed on: the contract's state is float32)."""
    T = 260
    (q, k, v, beta, gate), S0 = _inputs(1, T, 2, 16, 16, seed=sum(cuts))
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0)
    edges = [0, *cuts, T]
    state, parts = S0, []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        o, state = chunk_delta_rule_torch(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b],
                                          log_gate=gate[:, a:b], initial_state=state, output_final_state=True,
                                          dtype=torch.float64)
        parts.append(o)
    _close(torch.cat(parts, 1), o_ref, 1e-6)
    _close(state, S_ref, 1e-6)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("cuts", [(1,), (64,), (65, 200), (33, 34, 250)])
def test_summaries_fold_to_one_pass_exactly(gated, cuts):
    """The split's algebra (stages): spans run from zero, their summaries folded in order and
    each span's outputs completed by its entering state's share, equal one pass in float64 at
    any cut (to round-off), states and outputs; so does one pass continued over the cuts."""
    T = 300
    (q, k, v, beta, gate), S0 = _inputs(2, T, 2, 16, 8, seed=len(cuts) + gated, gated=gated)
    whole = span_parts(q, k, v, beta, log_gate=gate, block_size=16, span=64)
    o_ref, _ = _reference(q, k, v, beta, gate, S0)
    _close(whole.o_local + state_share(whole.q_state, S0), o_ref, 1e-12)
    edges = [0, *cuts, T]
    parts = [span_parts(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], log_gate=_cut(gate, a, b),
                        block_size=16, span=64) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    folded = fold_summaries([p.summary for p in parts])
    _close(folded.M, whole.summary.M, 1e-12)
    _close(folded.dS, whole.summary.dS, 1e-12)
    _close(advance(folded, S0), advance(whole.summary, S0), 1e-12)
    state, outs = S0, []
    for p in parts:  # each span's entering state from the summaries before it
        outs.append(p.o_local + state_share(p.q_state, state))
        state = advance(p.summary, state)
    _close(torch.cat(outs, 1), o_ref, 1e-12)
    alone = span_summary(k[:, :cuts[0]], v[:, :cuts[0]], beta[:, :cuts[0]], log_gate=_cut(gate, 0, cuts[0]))
    _close(alone.M, parts[0].summary.M, 1e-12)
    _close(alone.dS, parts[0].summary.dS, 1e-12)
    # one pass continued over the cuts (before=: the running summary, as the split's pass 1
    # carries it from span to span) is the whole pass
    run, pieces = None, []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        p = span_parts(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], log_gate=_cut(gate, a, b),
                       block_size=16, span=64, before=run)
        run = p.summary
        pieces.append(p)
    _close(torch.cat([p.o_local for p in pieces], 1), whole.o_local, 1e-12)
    _close(torch.cat([p.q_state for p in pieces], 1), whole.q_state, 1e-12)
    _close(run.M, whole.summary.M, 1e-12)
    _close(run.dS, whole.summary.dS, 1e-12)


def test_beta_zero_only_decays_the_state():
    """beta = 0 writes nothing: the state entering is only decayed, S_t = exp(b_t) S0 with b_t
    the cumulative log-gate, and o_t = scale q_t^T S_t."""
    (q, k, v, beta, gate), S0 = _inputs(1, 100, 2, 16, 8, seed=9)
    o, S = delta_rule(q, k, v, torch.zeros_like(beta), log_gate=gate, initial_state=S0,
                      output_final_state=True)
    b = gate.cumsum(1)  # (B, T, H)
    want = torch.einsum("bthk,bhkv->bthv", q, S0) * torch.exp(b).unsqueeze(-1) * 16 ** -0.5
    _close(o, want, 1e-12)
    _close(S, S0 * torch.exp(b[:, -1]).view(1, 2, 1, 1), 1e-6)


def test_gates_of_zero_and_near_minus_infinity():
    """A gate of exactly 0 keeps the state (the delta rule unchanged); gates of -1e30 and -inf
    empty it at their positions (counted as LOG_GATE_MIN, -110: exp of it is ~1.7e-48)."""
    T = 130
    (q, k, v, beta, _), S0 = _inputs(1, T, 3, 16, 8, seed=11)
    gate = torch.zeros(1, T, 3, dtype=torch.float64)
    gate[0, 5, 1], gate[0, 64, 1], gate[0, 100, 2] = -1e30, float("-inf"), float("-inf")
    gate[0, 30:40, 2] = -0.5
    o, S = chunk_delta_rule_torch(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    _close(o, o_ref, 1e-12)
    _close(S, S_ref, 1e-6)
    o_plain, _ = _reference(q, k, v, beta, None, S0)
    _close(o[..., 0, :], o_plain[..., 0, :], 1e-12)  # head 0: every gate 0
    # head 2's state before position 100 is forgotten: what follows is the run from zero there
    o_after, _ = _reference(q[:, 100:], k[:, 100:], v[:, 100:], beta[:, 100:], gate[:, 100:], None)
    _close(o[:, 100:, 2], o_after[:, :, 2], 1e-12)


def test_gradients_match_the_recurrence():
    """Plain autograd through the chunked form equals autograd through the recurrence (float64):
    q, k, v, beta, the log-gates and the entering state, from the outputs and the final state."""
    (q, k, v, beta, gate), S0 = _inputs(1, 40, 2, 8, 8, seed=13)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, beta, gate, S0)]
    g = torch.Generator().manual_seed(14)
    w_o = torch.randn(1, 40, 2, 8, generator=g, dtype=torch.float64)
    w_S = torch.randn(1, 2, 8, 8, generator=g, dtype=torch.float64)
    grads = []
    for fn, kw in ((chunk_delta_rule_torch, dict(block_size=16, dtype=torch.float64)),
                   (naive_recurrent_delta_rule, {})):
        qq, kk, vv, bb, gg, ss = leaves
        o, S = fn(qq, kk, vv, bb, log_gate=gg, initial_state=ss, output_final_state=True, **kw)
        if S.dtype != torch.float64:  # the contract returns float32; compare in the compute dtype
            S = S.double()
        loss = (o * w_o).sum() + (S * w_S).sum()
        grads.append(torch.autograd.grad(loss, leaves))
    for got, want in zip(*grads, strict=True):
        _close(got, want, 1e-6)  # S passes through float32 in both


@pytest.mark.slow  # a million positions, float32 in 16 calls and float64 in one
def test_million_positions_in_16_calls_vs_float64():
    """1,000,000 positions in 16 float32 calls carrying the state equal the float64 chunked form
    in one call, itself anchored to the float64 recurrence on the first 20,000 positions (and on
    every awkward shape above: the recurrence over all of it would be a million Python steps).
    Head 0 remembers ~10^4 positions, head 1 ~5."""
    T, H, K, head = 1_000_000, 2, 8, 20_000
    g = torch.Generator().manual_seed(5)  # float32 draws: float64 ones took a quarter of the time
    q, k = (F.normalize(torch.randn(1, T, H, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(1, T, H, K, generator=g)
    beta = torch.sigmoid(torch.randn(1, T, H, generator=g))
    g = torch.Generator().manual_seed(6)
    gate = torch.stack([F.logsigmoid(torch.randn(T, generator=g) + 9.0),
                        F.logsigmoid(torch.randn(T, generator=g) + 1.5)], -1)[None].float()
    with torch.inference_mode():
        o_ref, S_ref = chunk_delta_rule_torch(q.double(), k.double(), v.double(), beta.double(),
                                              log_gate=gate.double(), output_final_state=True,
                                              dtype=torch.float64)
        o_rec, _ = _reference(q[:, :head], k[:, :head], v[:, :head], beta[:, :head], gate[:, :head], None)
        _close(o_ref[:, :head], o_rec, 1e-10)
        state, parts = None, []
        step = math.ceil(T / 16)
        for a in range(0, T, step):
            o, state = delta_rule(q[:, a:a + step], k[:, a:a + step], v[:, a:a + step], beta[:, a:a + step],
                                  log_gate=gate[:, a:a + step], initial_state=state, output_final_state=True)
            parts.append(o)
    _close(torch.cat(parts, 1), o_ref, 1e-5)
    _close(state, S_ref, 1e-5)


@pytest.mark.parametrize("T", [1, 63, 65, 300])
def test_matches_flash_linear_attention_gated_delta_rule(T):
    """fla's naive gated delta rule (recurrent and chunked) and ours on the same q, k, v, beta,
    g, an initial state in and the final state out: a Gated DeltaNet layer trained with fla
    computes the same thing here."""
    fla = fla_naive("gated_delta_rule")
    (q, k, v, beta, gate), S0 = _inputs(2, T, 3, 16, 32, seed=T, dtype=torch.float32)
    want, S_want = fla.naive_recurrent_gated_delta_rule(q, k, v, beta, gate, initial_state=S0.clone(),
                                                        output_final_state=True)
    want_chunk, S_chunk = fla.naive_chunk_gated_delta_rule(q, k, v, gate, beta, initial_state=S0.clone(),
                                                           output_final_state=True)
    for fn in (naive_recurrent_delta_rule, delta_rule):
        o, S = fn(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
        for ref, S_ref in ((want, S_want), (want_chunk, S_chunk)):
            _close(o, ref, 1e-5)
            _close(S, S_ref, 1e-5)


@pytest.mark.parametrize("T", [1, 63, 65, 300])
def test_matches_flash_linear_attention_delta_rule(T):
    """fla's naive delta rule (its recurrence, in the (B, H, T, K) layout, scale K^-1/2 inside)
    and ours; and its chunkwise form (no entering state, T a whole number of its blocks of 32)."""
    fla = fla_naive("delta_rule")
    (q, k, v, beta, _), S0 = _inputs(2, T, 3, 16, 32, seed=T, dtype=torch.float32, gated=False)
    heads_first = [x.transpose(1, 2) for x in (q, k, v, beta)]
    want, S_want = fla.delta_rule_recurrence(*heads_first, initial_state=S0.clone(), output_final_state=True)
    o, S = delta_rule(q, k, v, beta, initial_state=S0, output_final_state=True)
    _close(o, want.transpose(1, 2), 1e-5)
    _close(S, S_want, 1e-5)
    n = T // 32 * 32
    if n:
        want_chunk, S_chunk = fla.delta_rule_chunkwise(*[x[:, :, :n] for x in heads_first])
        o, S = delta_rule(q[:, :n], k[:, :n], v[:, :n], beta[:, :n], output_final_state=True)
        _close(o, want_chunk.transpose(1, 2), 1e-5)
        _close(S, S_chunk, 1e-5)


def test_bad_shapes_and_gates_are_refused():
    (q, k, v, beta, gate), _ = _inputs(1, 10, 2, 8, 8, seed=1)
    with pytest.raises(ValueError, match="beta must have shape"):
        delta_rule(q, k, v, beta[:, :5])
    with pytest.raises(ValueError, match="log_gate must be <= 0"):
        delta_rule(q, k, v, beta, log_gate=-gate)
    with pytest.raises(ValueError, match="log_gate must have shape"):
        delta_rule(q, k, v, beta, log_gate=gate[..., :1])
