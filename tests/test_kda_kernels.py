"""Kimi Delta Attention's chunked form and stages (linpipe.kernels.kda) against the float64
recurrence: awkward shapes around the blocks' edges with grouped value heads, final states,
split and resumed at any cut, the stages' summaries folded at any cut, gates of exactly 0 and
strong enough to empty a channel within a block (the explicit path), beta = 0, a gate shared by
every channel (the gated delta rule), gradients, a million positions in 16 calls, and the
reference libraries' own forms (fla's naive KDA, transformers' Kimi Linear functions)."""
import inspect
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _fla_data import FLA, fla_naive
from _quick import cells

from linpipe.kernels.delta_rule import chunk_delta_rule_torch
from linpipe.kernels.kda import (
    advance,
    chunk_kda_torch,
    fold_summaries,
    kda,
    naive_recurrent_kda,
    span_parts,
    span_summary,
    state_share,
)
from linpipe.kernels.kda import stages as kda_stages

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs(B, T, H, K, V, *, HV=None, seed, dtype=torch.float64, strength=1.0):
    """q, k L2-normalised as a layer makes them, beta in (0, 1), per-channel gates logsigmoid(x)
    / 4 * strength (channels of several strengths), and an entering state; HV value heads."""
    HV = HV or H
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=g, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=g, dtype=torch.float64))
    gate = F.logsigmoid(torch.randn(B, T, HV, K, generator=g, dtype=torch.float64) * 3 + 1) / 4 * strength
    S0 = torch.randn(B, HV, K, V, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, beta, gate)], S0.to(dtype)


def _close(a, b, tol):
    """Max error relative to the reference's largest magnitude (at least 1)."""
    assert a.shape == b.shape and b.numel()
    err = float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1.0))
    assert err <= tol, err


def _reference(q, k, v, beta, gate, S0, **kw):
    return naive_recurrent_kda(q.double(), k.double(), v.double(), beta.double(), log_gate=gate.double(),
                               initial_state=None if S0 is None else S0.double(), output_final_state=True,
                               **kw)


# the quick suite: 1, both sides of 64 (a multiple of both blocks) and a long one
@pytest.mark.parametrize("T", cells([1, 15, 16, 17, 31, 32, 33, 63, 65, 300], quick=[1, 63, 65, 300]))
@pytest.mark.parametrize("HV", [3, 6])
def test_chunked_equals_naive_fp64(T, HV):
    """Every length around the blocks' edges (16, 32 = BLOCK_SIZE), with and without grouped value
    heads (6 value heads on 3 query/key heads), outputs and final states, K != V."""
    (q, k, v, beta, gate), S0 = _inputs(2, T, 3, 16, 8, HV=HV, seed=T + HV)
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0)
    for block_size in (16, 32):
        o, S = chunk_kda_torch(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True,
                               block_size=block_size)
        assert o.dtype == torch.float64 and S.dtype == torch.float32
        _close(o, o_ref, 1e-12)
        _close(S, S_ref, 1e-6)  # S is float32 in the contract
    _, S64 = chunk_kda_torch(q, k, v, beta, log_gate=gate, initial_state=S0, dtype=torch.float64,
                             output_final_state=True)
    _close(S64, S_ref, 1e-6)


@pytest.mark.parametrize("strength", [1.0, 10.0])
def test_float32_within_1e5_of_fp64(strength):
    """The contract's float32 compute over several spans (SPAN 2048) against the float64 form
    (itself within 1e-12 of the recurrence above), with gates of the usual strengths and strong
    ones (some channels emptied within a block: the explicit path); run twice, so that the second
    call reuses the scratch buffers."""
    (q, k, v, beta, gate), S0 = _inputs(1, 4500, 2, 32, 16, HV=4, seed=3, strength=strength)
    o_ref, S_ref = chunk_kda_torch(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True,
                                   dtype=torch.float64)
    q, k, v, beta, gate, S0 = (x.float() for x in (q, k, v, beta, gate, S0))
    for _ in range(2):
        with torch.inference_mode():
            o, S = kda(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
        assert o.dtype == torch.float32
        _close(o, o_ref, 1e-5)
        _close(S, S_ref, 1e-5)


@pytest.mark.parametrize("cuts", [(1,), (63,), (64, 65), (17, 100, 199)])
def test_split_and_resumed_at_any_cut(cuts):
    """Calls cut anywhere, each resumed from the last one's final state, equal one call (to the
    float32 round-off of the state handed on: the contract's state is float32)."""
    T = 260
    (q, k, v, beta, gate), S0 = _inputs(1, T, 2, 16, 16, HV=4, seed=sum(cuts))
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0)
    edges = [0, *cuts, T]
    state, parts = S0, []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        o, state = chunk_kda_torch(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], log_gate=gate[:, a:b],
                                   initial_state=state, output_final_state=True, dtype=torch.float64)
        parts.append(o)
    _close(torch.cat(parts, 1), o_ref, 1e-6)
    _close(state, S_ref, 1e-6)


@pytest.mark.parametrize("cuts", [(1,), (64,), (33, 34, 250)])
def test_summaries_fold_to_one_pass_exactly(cuts):
    """The split's algebra (stages): spans run from zero, their summaries folded in order and
    each span's outputs completed by its entering state's share, equal one pass in float64 at
    any cut (to round-off), states and outputs; so does one pass continued over the cuts."""
    T = 300
    (q, k, v, beta, gate), S0 = _inputs(2, T, 2, 16, 8, HV=4, seed=len(cuts))
    whole = span_parts(q, k, v, beta, log_gate=gate, block_size=16, span=64)
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0)
    _close(whole.o_local + state_share(whole.q_state, S0), o_ref, 1e-12)
    _close(advance(whole.summary, S0), S_ref, 1e-6)
    edges = [0, *cuts, T]
    pieces = [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    parts = [span_parts(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], log_gate=gate[:, a:b], block_size=16,
                        span=64) for a, b in pieces]
    folded = fold_summaries([p.summary for p in parts])
    _close(folded.M, whole.summary.M, 1e-12)
    _close(folded.dS, whole.summary.dS, 1e-12)
    state, outs = S0, []
    for p in parts:  # each span's entering state from the summaries before it
        outs.append(p.o_local + state_share(p.q_state, state))
        state = advance(p.summary, state)
    _close(torch.cat(outs, 1), o_ref, 1e-12)
    a, b = pieces[0]
    alone = span_summary(k[:, a:b], v[:, a:b], beta[:, a:b], log_gate=gate[:, a:b])
    _close(alone.M, parts[0].summary.M, 1e-12)
    _close(alone.dS, parts[0].summary.dS, 1e-12)
    run, continued = None, []
    for a, b in pieces:  # one pass continued over the cuts, as the split's pass 1 carries it
        p = span_parts(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], log_gate=gate[:, a:b], block_size=16,
                       span=64, before=run)
        run = p.summary
        continued.append(p)
    _close(torch.cat([p.o_local for p in continued], 1), whole.o_local, 1e-12)
    _close(torch.cat([p.q_state for p in continued], 1), whole.q_state, 1e-12)
    _close(run.M, whole.summary.M, 1e-12)
    _close(run.dS, whole.summary.dS, 1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_gates_of_zero_and_near_minus_infinity(dtype, tol):
    """Gates of exactly 0 keep a channel; -1e30 and -inf empty it (counted as LOG_GATE_MIN, -110);
    a channel whose gates sum past 2 FACTOR_MAX within a block (its state emptied there) puts the
    block on the explicit path, and a stretch of such blocks; no inf or NaN anywhere, in both the
    scratch path (inference) and the autograd one."""
    T = 300
    (q, k, v, beta, gate), S0 = _inputs(1, T, 2, 8, 8, HV=2, seed=11, dtype=dtype)
    gate[0, 5, 0, 0] = -1e30
    gate[0, 40:44, 1, :3] = float("-inf")
    gate[0, 70:80, 0, 2:5] = -20.0  # 200 within one block
    gate[0, 130:230, 1, 6] = -5.5  # past 2 FACTOR_MAX in every block of a stretch
    gate[0, 160:230, 0, 1] = -5.0  # fla's lower_bound gate at its floor: the factors' widest range
    gate[0, :, :, 7] = 0.0  # a channel that never decays
    gate[0, 240:] = 0.0  # a stretch of zero gates for every channel
    assert 32 * 5.5 > 2 * kda_stages.FACTOR_MAX > 31 * 5.0
    o_ref, S_ref = _reference(q, k, v, beta, gate, S0)
    with torch.inference_mode():
        o, S = kda(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
    leaves = [x.clone().requires_grad_() for x in (q, k)]
    o_g, S_g = chunk_kda_torch(*leaves, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
    for got, state in ((o, S), (o_g.detach(), S_g.detach())):
        assert torch.isfinite(got).all() and torch.isfinite(state).all()
        _close(got, o_ref, tol)
        _close(state, S_ref, max(tol, 1e-6))


@pytest.mark.parametrize("strength", [1.0, 60.0])  # 60: gates near -10 a position, deep rows in each block
def test_a_position_reads_nothing_after_it(strength):
    """In float32, a position's outputs are the same bits whatever follows it in its block (a
    record batched with longer ones, or cut short): one batch of three records of different
    gates against the first alone at lengths that end inside a block; and span_parts' outputs."""
    (q, k, v, beta, gate), S0 = _inputs(3, 100, 2, 16, 16, HV=4, seed=5, dtype=torch.float32,
                                        strength=strength)
    with torch.inference_mode():
        o, _ = kda(q, k, v, beta, log_gate=gate, initial_state=S0)
        parts = span_parts(q, k, v, beta, log_gate=gate)
        for t in (1, 33, 60, 99):
            alone, _ = kda(q[:1, :t], k[:1, :t], v[:1, :t], beta[:1, :t], log_gate=gate[:1, :t],
                           initial_state=S0[:1])
            assert torch.equal(o[:1, :t], alone), t
            short = span_parts(q[:1, :t], k[:1, :t], v[:1, :t], beta[:1, :t], log_gate=gate[:1, :t])
            assert torch.equal(parts.o_local[:1, :t], short.o_local), t
            assert torch.equal(parts.q_state[:1, :t], short.q_state), t


def test_beta_zero_only_decays_the_state():
    """beta = 0 writes nothing: the state entering is only decayed channel by channel, S_t =
    Diag(exp(b_t)) S0 with b_t the cumulative log-gate, and o_t = scale q_t^T S_t."""
    (q, k, v, beta, gate), S0 = _inputs(1, 100, 2, 16, 8, seed=9)
    o, S = kda(q, k, v, torch.zeros_like(beta), log_gate=gate, initial_state=S0, output_final_state=True)
    b = gate.cumsum(1)  # (B, T, H, K)
    want = torch.einsum("bthk,bhkv->bthv", q * torch.exp(b), S0) * 16 ** -0.5
    _close(o, want, 1e-12)
    _close(S, S0 * torch.exp(b[:, -1]).unsqueeze(-1), 1e-6)


def test_one_gate_for_every_channel_is_the_gated_delta_rule():
    """With g_t the same in every channel, Diag(exp(g_t)) is a scalar and KDA is the gated delta
    rule: linpipe's two chunked forms agree."""
    (q, k, v, beta, gate), S0 = _inputs(1, 200, 3, 16, 8, seed=21)
    scalar = gate[..., 0]
    o, S = chunk_kda_torch(q, k, v, beta, log_gate=scalar.unsqueeze(-1).expand_as(gate), initial_state=S0,
                           output_final_state=True)
    o_dr, S_dr = chunk_delta_rule_torch(q, k, v, beta, log_gate=scalar, initial_state=S0,
                                        output_final_state=True)
    _close(o, o_dr, 1e-12)
    _close(S, S_dr, 1e-6)


def test_gradients_match_the_recurrence():
    """Plain autograd through the chunked form equals autograd through the recurrence (float64):
    q, k, v, beta, the log-gates and the entering state, from the outputs and the final state."""
    (q, k, v, beta, gate), S0 = _inputs(1, 40, 2, 8, 8, HV=4, seed=13)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, beta, gate, S0)]
    g = torch.Generator().manual_seed(14)
    w_o = torch.randn(1, 40, 4, 8, generator=g, dtype=torch.float64)
    w_S = torch.randn(1, 4, 8, 8, generator=g, dtype=torch.float64)
    grads = []
    for fn, kw in ((chunk_kda_torch, dict(block_size=16, dtype=torch.float64)), (naive_recurrent_kda, {})):
        qq, kk, vv, bb, gg, ss = leaves
        o, S = fn(qq, kk, vv, bb, log_gate=gg, initial_state=ss, output_final_state=True, **kw)
        loss = (o * w_o).sum() + (S.double() * w_S).sum()
        grads.append(torch.autograd.grad(loss, leaves))
    for got, want in zip(*grads, strict=True):
        _close(got, want, 1e-6)  # S passes through float32 in both


@pytest.mark.parametrize("fall", [2.0, 4.0])  # nats a position: 64 (factored) / 128 (explicit) a block
def test_float32_gradients_under_strong_gates_are_finite_and_the_recurrences(fall):
    """float32 autograd (training's) through blocks whose gates fall past 44 nats, where a
    quotient's gradient by e^(b - rho) squared would underflow, and past FACTOR_MAX (the explicit
    rows): finite, and the float64 recurrence's gradients within 1e-3."""
    (q, k, v, beta, _), S0 = _inputs(1, 70, 2, 8, 8, HV=4, seed=15)
    gate = torch.full((1, 70, 4, 8), -fall, dtype=torch.float64)
    gate[..., ::2] = -0.01  # mild channels beside the strong ones
    leaves = [x.clone().requires_grad_() for x in (q, k, v, beta, gate, S0)]
    g = torch.Generator().manual_seed(16)
    w_o = torch.randn(1, 70, 4, 8, generator=g, dtype=torch.float64)
    grads = []
    forms = ((chunk_kda_torch, dict(block_size=32), torch.float32), (naive_recurrent_kda, {}, None))
    for fn, kw, dt in forms:
        args = [x.to(dt) if dt else x for x in leaves]
        o, S = fn(*args[:4], log_gate=args[4], initial_state=args[5], output_final_state=True, **kw)
        grads.append(torch.autograd.grad((o.double() * w_o).sum() + S.double().sum(), leaves))
    for got, want in zip(*grads, strict=True):
        assert torch.isfinite(got).all()
        _close(got, want, 1e-3)


@pytest.mark.slow  # a million positions, float32 in 16 calls and float64 in one
def test_million_positions_in_16_calls_vs_float64():
    """1,000,000 positions in 16 float32 calls carrying the state equal the float64 chunked form
    in one call, itself anchored to the float64 recurrence on the first 20,000 positions (and on
    every awkward shape above). Channels remember from ~5 to ~10^4 positions."""
    T, H, K, head = 1_000_000, 1, 8, 20_000  # one head: its 8 channels span every memory
    g = torch.Generator().manual_seed(5)  # float32 draws: float64 ones took a third of the time
    q, k = (F.normalize(torch.randn(1, T, H, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(1, T, H, K, generator=g)
    beta = torch.sigmoid(torch.randn(1, T, H, generator=g))
    bias = torch.linspace(1.5, 9.0, H * K).view(1, 1, H, K)
    gate = F.logsigmoid(torch.randn(1, T, H, K, generator=g) + bias)
    with torch.inference_mode():
        o_ref, S_ref = chunk_kda_torch(q.double(), k.double(), v.double(), beta.double(),
                                       log_gate=gate.double(), output_final_state=True, dtype=torch.float64)
        o_rec, _ = _reference(q[:, :head], k[:, :head], v[:, :head], beta[:, :head], gate[:, :head], None)
        _close(o_ref[:, :head], o_rec, 1e-10)
        state, parts = None, []
        step = math.ceil(T / 16)
        for a in range(0, T, step):
            o, state = kda(q[:, a:a + step], k[:, a:a + step], v[:, a:a + step], beta[:, a:a + step],
                           log_gate=gate[:, a:a + step], initial_state=state, output_final_state=True)
            parts.append(o)
    _close(torch.cat(parts, 1), o_ref, 1e-5)
    _close(state, S_ref, 1e-5)


@pytest.mark.parametrize("T", [1, 63, 65, 300])
def test_matches_flash_linear_attention_kda(T):
    """fla's naive KDA (its recurrence; its chunked form where T is a whole number of its chunks
    of 64) and ours on the same q, k, v, g, beta, grouped value heads, an initial state in and the
    final state out: a KDA layer trained with fla computes the same thing here."""
    fla = fla_naive("kda")
    (q, k, v, beta, gate), S0 = _inputs(2, T, 2, 16, 32, HV=4, seed=T, dtype=torch.float32)
    want, S_want = fla.naive_recurrent_kda(q, k, v, gate, beta, initial_state=S0.clone(),
                                           output_final_state=True)
    o_rec, S_rec = naive_recurrent_kda(q, k, v, beta, log_gate=gate, initial_state=S0,
                                       output_final_state=True)
    o, S = kda(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
    for got, state in ((o_rec, S_rec), (o, S)):
        _close(got, want, 1e-5)
        _close(state, S_want, 1e-5)
    n = T // 64 * 64
    if n:
        want_chunk, S_chunk = fla.naive_chunk_kda(q[:, :n], k[:, :n], v[:, :n], gate[:, :n], beta[:, :n],
                                                  initial_state=S0.clone(), output_final_state=True)
        o, S = kda(q[:, :n], k[:, :n], v[:, :n], beta[:, :n], log_gate=gate[:, :n], initial_state=S0,
                   output_final_state=True)
        _close(o, want_chunk, 1e-5)
        _close(S, S_chunk, 1e-5)


@pytest.mark.slow  # importing transformers' Kimi Linear module takes a minute on a busy 2-core machine
def test_matches_transformers_kimi_linear():
    """transformers' Kimi Linear functions (their PyTorch paths: recurrent_kimi_delta_attention and
    chunk_kimi_delta_attention, which pads to its chunks of 64) on the same inputs, no grouped
    value heads (transformers has none), an initial state in and the final state out."""
    modeling = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    recurrent = inspect.unwrap(modeling.recurrent_kimi_delta_attention)  # not fla's kernel
    chunk = inspect.unwrap(modeling.chunk_kimi_delta_attention)
    (q, k, v, beta, gate), S0 = _inputs(2, 100, 2, 16, 16, seed=17, dtype=torch.float32)
    o, S = kda(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True)
    for fn in (recurrent, chunk):
        want, S_want = fn(q, k, v, g=gate, beta=beta, initial_state=S0.clone(), output_final_state=True)
        _close(o, want, 1e-5)
        _close(S, S_want, 1e-5)


def test_bad_shapes_and_gates_are_refused():
    (q, k, v, beta, gate), _ = _inputs(1, 10, 2, 8, 8, HV=4, seed=1)
    with pytest.raises(ValueError, match="beta must have shape"):
        kda(q, k, v, beta[:, :5], log_gate=gate)
    with pytest.raises(ValueError, match="log_gate must be <= 0"):
        kda(q, k, v, beta, log_gate=-gate)
    with pytest.raises(ValueError, match="log_gate must have shape"):
        kda(q, k, v, beta, log_gate=gate[..., :1])
    with pytest.raises(ValueError, match="a multiple of"):
        kda(q, k, v[:, :, :3], beta[..., :3], log_gate=gate[:, :, :3])


# fla's KDA model under the Triton interpreter, minutes: before a merge (pytest -m premerge)
@pytest.mark.slow
@pytest.mark.premerge
def test_kda_fixtures_are_flas_word(tmp_path):
    """fla itself, live, makes the KDA fixtures' weights and their predictions on the short record
    again (tests/fla_fixtures/make_fla_fixtures.py, run outside the checkout's root: its top
    folder kernels/ would shadow Hugging Face's package of that name)."""
    pytest.importorskip("transformers")
    pytest.importorskip("fla.models")
    from safetensors.torch import load_file

    script = Path(__file__).parent / "fla_fixtures" / "make_fla_fixtures.py"
    r = subprocess.run([sys.executable, str(script), str(tmp_path), "kda", "kda_gva", "ce_mt"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    for family in ("kda", "kda_gva"):
        live, kept = (load_file(str(d / family / "model.safetensors")) for d in (tmp_path, FLA))
        assert live.keys() == kept.keys()
        for k in live:
            assert torch.equal(live[k], kept[k]), (family, k)
        fresh, stored = np.load(tmp_path / family / "expected.npz"), np.load(FLA / family / "expected.npz")
        for k in ("ce_mt/logprob", "ce_mt/entropy"):
            np.testing.assert_allclose(fresh[k], stored[k], rtol=0, atol=1e-6, err_msg=f"{family} {k}")
