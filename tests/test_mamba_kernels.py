"""Mamba's selective scan (linpipe.kernels.mamba): the CPU chunked form against the float64
recurrence on awkward lengths around the blocks and spans, initial and final states, a sequence
split and resumed (calls carrying the state, and the span stages folded over segments), decays
strong enough to empty the state and none at all, gradients, a million positions, and the
reference library's own forms on the same inputs (transformers' `mamba_selective_scan` and
`mamba_selective_state_update`; fla's Mamba layer and the CUDA form through fla's GLA kernels are
in tests/test_fla_kernels.py, which runs Triton's interpreter)."""
import math

import pytest
import torch
import torch.nn.functional as F
from _quick import cells

from linpipe.kernels.mamba import (
    advance,
    chunk_selective_scan_torch,
    fold_summaries,
    naive_selective_scan,
    selective_scan,
    span_parts,
    span_summary,
    state_share,
)
from linpipe.kernels.mamba import stages as stages_mod

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs(batch, T, D, N, *, seed, dtype=torch.float64):
    """Mamba's operands as its layer makes them: delta before its bias and softplus, A = -exp(A_log)
    with A_log around log(1..N) (S4D's init), a state to enter with."""
    g = torch.Generator().manual_seed(seed)
    u, delta, z = (torch.randn(batch, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    B, C = (torch.randn(batch, T, N, generator=g, dtype=torch.float64) for _ in range(2))
    A_log = torch.log(torch.arange(1, N + 1, dtype=torch.float64)) + 0.5 * torch.randn(D, N, generator=g,
                                                                                        dtype=torch.float64)
    A = -torch.exp(A_log)
    Dp = torch.randn(D, generator=g, dtype=torch.float64)
    bias = torch.randn(D, generator=g, dtype=torch.float64) - 2.0  # softplus(bias) ~ 0.13: Mamba's dt range
    h0 = torch.randn(batch, D, N, generator=g, dtype=torch.float64)
    ops = dict(u=u, delta=delta, A=A, B=B, C=C)
    opts = dict(D=Dp, z=z, delta_bias=bias, delta_softplus=True)
    return _cast(ops, dtype), _cast(opts, dtype), h0.to(dtype)


def _close(a, b, tol):
    """Max error relative to the largest reference magnitude (at least 1)."""
    assert a.shape == b.shape
    scale = b.abs().max().clamp(min=1.0) if b.numel() else 1.0
    err = float((a.double() - b.double()).abs().max() / scale) if b.numel() else 0.0
    assert err <= tol, err


def _cast(d, dtype):
    return {k: v.to(dtype) if torch.is_tensor(v) else v for k, v in d.items()}


def _cut(d, a, b):
    """The per-position operands of d (all but A, D, delta_bias) at positions a..b-1."""
    return {k: v[:, a:b] if k in ("u", "delta", "B", "C", "z") else v for k, v in d.items()}


def _reference(ops, opts, h0):
    return naive_selective_scan(**_cast(ops, torch.float64), **_cast(opts, torch.float64),
                                initial_state=h0.double(), output_final_state=True)


# the quick suite: 1, both sides of 64 and a long one (two spans of 256 at blocks of 32)
@pytest.mark.parametrize("T", cells([1, 31, 32, 33, 63, 65, 300, 513], quick=[1, 63, 65, 300]))
def test_chunked_equals_naive_fp64(T):
    """Every length around the block (16, 32) and span edges, outputs and final states; then
    float32: within 1e-5 of the float64 recurrence relative to the largest output (measured
    1.3e-7 on outputs and 9e-8 on states at T = 300; 2.5e-7 and 7e-8 at T = 4,500)."""
    ops, opts, h0 = _inputs(2, T, 12, 16, seed=T)
    y_ref, h_ref = _reference(ops, opts, h0)
    for block, span in ((16, 64), (32, 256), (7, 21)):
        y, h = chunk_selective_scan_torch(**ops, **opts, initial_state=h0, output_final_state=True,
                                          block_size=block, span=span)
        assert y.dtype == torch.float64 and h.dtype == torch.float32
        _close(y, y_ref, 1e-12)
        _close(h, h_ref, 1e-6)  # final states are float32 in both
    with torch.inference_mode():  # the reused buffers' path
        y, h = selective_scan(**_cast(ops, torch.float32), **_cast(opts, torch.float32),
                              initial_state=h0.float(), output_final_state=True)
    assert y.dtype == torch.float32
    _close(y, y_ref, 1e-5)
    _close(h, h_ref, 1e-5)


def test_without_the_optional_arguments():
    """No D, gate, bias or softplus (delta is dt as given), no entering state, no final state out:
    selective_scan_ref's defaults."""
    ops, _, _ = _inputs(1, 40, 6, 4, seed=1)
    ops["delta"] = ops["delta"].abs() * 0.2
    y, h = chunk_selective_scan_torch(**ops)
    y_ref, _ = naive_selective_scan(**ops)
    assert h is None
    _close(y, y_ref, 1e-12)


@pytest.mark.parametrize("cuts", [(1,), (17,), (32, 33), (5, 100, 101, 250)])
def test_split_and_resumed_at_any_cut(cuts):
    """Calls that carry the final state into the next give one call's outputs and final state,
    wherever the cuts fall; and the span stages over the same segments (each run from a zero
    state, the summaries folded in order, each segment's entering state's share added) give
    them too."""
    T = 300
    ops, opts, h0 = _inputs(1, T, 8, 16, seed=7)
    A, z = ops["A"], opts["z"]
    y_one, h_one = chunk_selective_scan_torch(**ops, **opts, initial_state=h0, output_final_state=True)
    edges = [0, *cuts, T]
    cut = [(a, b) for a, b in zip(edges, edges[1:], strict=False)]
    h, outs = h0, []
    for a, b in cut:
        y, h = chunk_selective_scan_torch(**_cut(ops, a, b), **_cut(opts, a, b), initial_state=h,
                                          output_final_state=True)
        h = h.double()  # carried as the contract's float32
        outs.append(y)
    _close(torch.cat(outs, 1), y_one, 1e-6)
    _close(h, h_one, 1e-6)
    no_z = {k: v for k, v in opts.items() if k != "z"}
    parts = [span_parts(**_cut(ops, a, b), **no_z) for a, b in cut]
    h, outs = h0, []
    for (a, b), p in zip(cut, parts, strict=True):
        outs.append((p.o_local + state_share(p.dt_cum, ops["C"][:, a:b], A, h)) * F.silu(z[:, a:b]))
        h = advance(p.summary, h, A)
    _close(torch.cat(outs, 1), y_one, 1e-12)
    _close(h, h_one, 1e-6)
    _close(advance(fold_summaries([p.summary for p in parts], A), h0, A), h_one, 1e-6)
    # a pass continued over calls: the second from the first's summary counts from the first's zero
    first = span_summary(**_cut(ops, 0, cuts[0]), delta_bias=opts["delta_bias"], delta_softplus=True)
    rest = span_parts(**_cut(ops, cuts[0], T), **no_z, before=first)
    whole = span_parts(**ops, **no_z)
    _close(rest.o_local, whole.o_local[:, cuts[0]:], 1e-12)
    _close(rest.dt_cum, whole.dt_cum[:, cuts[0]:], 1e-12)
    _close(rest.summary.dh, whole.summary.dh, 1e-12)
    _close(rest.summary.dt_sum, whole.summary.dt_sum, 1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_decays_that_empty_the_state_and_none_at_all(dtype, tol, monkeypatch):
    """Time steps of 1e4 (a decay of exp(-1e4) or less: the state emptied at once, within a block,
    at a block's first row and over a stretch of blocks), steps of exactly 0 (the state kept
    whole for hundreds of positions, over a span edge) and a channel with A = 0 (a sum that never
    decays): no inf or NaN, and the recurrence's values."""
    monkeypatch.setattr(stages_mod, "SPAN_ELEMENTS", 256 * 6 * 16)  # spans of 256 positions
    span = stages_mod.span_positions(1, 6, 16, stages_mod.BLOCK_SIZE)
    assert span == 256
    T = 2 * span + 77
    ops, opts, h0 = _inputs(1, T, 6, 16, seed=3, dtype=dtype)
    delta = ops["delta"]
    delta[0, 5, 0] = 1e4
    delta[0, 64, 1] = 1e4  # a block's first row
    delta[0, 100:140, 2] = 1e4
    delta[0, span - 10:span + 300, 3] = -1e4  # softplus(-1e4) = 0: no step
    ops["A"][4] = 0.0  # channel 4 only adds
    y_ref, h_ref = _reference(ops, opts, h0)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            y, h = selective_scan(**ops, **opts, initial_state=h0.to(dtype), output_final_state=True)
        assert torch.isfinite(y).all() and torch.isfinite(h).all()
        _close(y, y_ref, tol)
        _close(h, h_ref, max(tol, 1e-6))
    # channel 2 forgets everything before 139: what follows is the run from a zero state there
    y_after, _ = naive_selective_scan(**_cut(ops, 139, T), **_cut(opts, 139, T))
    _close(y[:, 140:, 2], y_after[:, 1:, 2], tol)


def test_gradients_equal_the_recurrences():
    """Plain autograd through the chunked form (its out-of-place path) equals autograd through the
    recurrence, float64: every operand, the entering state, from the outputs and the final state."""
    ops, opts, h0 = _inputs(1, 70, 4, 8, seed=5)
    names = list(ops) + ["D", "z", "delta_bias"]
    leaves = {k: (ops | opts)[k].clone().requires_grad_() for k in names}
    h_leaf = h0.clone().requires_grad_()
    g = torch.Generator().manual_seed(6)
    w_y = torch.randn(1, 70, 4, generator=g, dtype=torch.float64)
    grads = []
    for fn, kw in ((chunk_selective_scan_torch, dict(block_size=16, span=32, dtype=torch.float64)), (
            naive_selective_scan, {})):
        y, h = fn(**leaves, delta_softplus=True, initial_state=h_leaf, output_final_state=True, **kw)
        loss = (y * w_y).sum() + h.double().square().sum()
        grads.append(torch.autograd.grad(loss, [*leaves.values(), h_leaf]))
    for got, want in zip(*grads, strict=True):
        assert torch.isfinite(got).all()
        _close(got, want, 1e-6)  # the final state passes through float32 in both


def test_bad_shapes_are_refused():
    ops, opts, h0 = _inputs(1, 5, 4, 3, seed=0)
    with pytest.raises(ValueError, match="A must be"):
        chunk_selective_scan_torch(**ops | {"A": ops["A"].t()})
    with pytest.raises(ValueError, match=r"C must be \(B, T, N\)"):
        chunk_selective_scan_torch(**ops | {"C": ops["C"][:, :4]})
    with pytest.raises(ValueError, match="initial_state must have shape"):
        chunk_selective_scan_torch(**ops, initial_state=h0.transpose(1, 2))
    with pytest.raises(ValueError, match="z must have shape"):
        selective_scan(**ops, z=opts["z"][..., :2])


@pytest.mark.slow  # a million positions: float32 in 16 calls and float64 in one
def test_million_positions_in_16_calls_vs_float64():
    """1,000,000 positions in 16 float32 calls carrying the state equal the float64 chunked form
    in one call, itself anchored to the float64 recurrence on the first 20,000 positions (and on
    every awkward shape above). The channels' time-step biases run from -9 to 1: steps of ~1e-4
    (a memory of ~10^4 positions) to ~1: four channels and four states carry every memory span
    (the chunked form has no path that depends on D or N; at 8 and 16 this took 3x as long)."""
    T, D, N, head = 1_000_000, 4, 4, 20_000
    ops, opts, h0 = _inputs(1, T, D, N, seed=5, dtype=torch.float32)
    opts["delta_bias"] = torch.linspace(-9.0, 1.0, D)
    with torch.inference_mode():
        y_ref, h_ref = chunk_selective_scan_torch(**ops, **opts, initial_state=h0, output_final_state=True,
                                                  dtype=torch.float64)
        y_rec, _ = naive_selective_scan(**_cast(_cut(ops, 0, head), torch.float64),
                                        **_cast(_cut(opts, 0, head), torch.float64), initial_state=h0)
        _close(y_ref[:, :head], y_rec, 1e-10)
        h, parts = h0, []
        step = math.ceil(T / 16)
        for a in range(0, T, step):
            y, h = selective_scan(**_cut(ops, a, a + step), **_cut(opts, a, a + step), initial_state=h,
                                  output_final_state=True)
            parts.append(y)
    _close(torch.cat(parts, 1), y_ref, 1e-5)
    _close(h, h_ref, 1e-5)


def _channels_first(x):
    return x.transpose(1, 2).contiguous()


@pytest.mark.slow  # importing transformers takes seconds of CPU (tens on a busy 2-core machine)
@pytest.mark.parametrize("T", [1, 63, 65, 300])
def test_matches_transformers_selective_scan(T):
    """transformers' `mamba_selective_scan` (MambaMixer's path on a CPU without mamba_ssm; channels
    first, (B, D, T), from a zero state) and its one-token `mamba_selective_state_update` (which
    takes a state: stepped from h0 over the first positions) compute what ours does."""
    pytest.importorskip("transformers")
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan, mamba_selective_state_update

    ops, opts, h0 = _inputs(2, T, 12, 16, seed=T, dtype=torch.float32)
    u, delta, A, B, C = (ops[k] for k in ("u", "delta", "A", "B", "C"))
    y_hf, h_hf = mamba_selective_scan(_channels_first(u), _channels_first(delta), A, _channels_first(B),
                                      _channels_first(C), D=opts["D"], z=_channels_first(opts["z"]),
                                      delta_bias=opts["delta_bias"], delta_softplus=True,
                                      return_last_state=True)
    for fn in (naive_selective_scan, selective_scan):
        y, h = fn(**ops, **opts, output_final_state=True)
        _close(y, y_hf.transpose(1, 2), 1e-5)
        _close(h, h_hf, 1e-5)
    steps = min(T, 20)
    state, ys = h0.clone(), []
    for t in range(steps):  # updates `state` in place
        ys.append(mamba_selective_state_update(state, u[:, t], delta[:, t], A, B[:, t], C[:, t],
                                               D=opts["D"], z=opts["z"][:, t], dt_bias=opts["delta_bias"],
                                               dt_softplus=True))
    y, h = selective_scan(**_cut(ops, 0, steps), **_cut(opts, 0, steps), initial_state=h0,
                          output_final_state=True)
    _close(y, torch.stack(ys, 1), 1e-5)
    _close(h, state, 1e-5)
