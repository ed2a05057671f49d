"""The mLSTM's chunked form and span stages (linpipe.kernels.mlstm) against the float64
recurrence: awkward shapes around the blocks' edges, query/key heads narrower than the value
heads (xLSTM-7B's qk_dim_factor 0.5), initial and final states, the empty state (m = -inf),
split and resumed at any cut, the stages' summaries folded at any cut, blocks whose stabiliser
jumps (the explicit path), gates at the ends of their range, a million positions in calls, and
transformers' own native mLSTM kernels on the same inputs."""
import pytest
import torch
from _quick import cells

from linpipe.kernels.mlstm import chunk as chunk_mod
from linpipe.kernels.mlstm import chunk_mlstm_torch, mlstm, naive_recurrent_mlstm
from linpipe.kernels.mlstm import stages as st

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs(B, T, H, K, V, *, seed, dtype=torch.float64, spread=3.0):
    """q, k, v, the gates' preactivations as an xLSTM layer makes them (soft-capped at 15, forget
    gates around sigmoid(3)), and an entering state (C, n, m)."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=torch.float64)
    ig = 15 * torch.tanh(torch.randn(B, T, H, generator=g, dtype=torch.float64) * spread / 15)
    fg = 15 * torch.tanh((torch.randn(B, T, H, generator=g, dtype=torch.float64) * 2 + 3) / 15)
    state = (torch.randn(B, H, K, V, generator=g, dtype=torch.float64),
             torch.randn(B, H, K, generator=g, dtype=torch.float64),
             torch.randn(B, H, generator=g, dtype=torch.float64))
    return [x.to(dtype) for x in (q, k, v, ig, fg)], state


def _close(a, b, tol):
    """Max error relative to the reference's largest magnitude (at least 1)."""
    assert a.shape == b.shape
    if not b.numel():
        return
    err = float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1.0))
    assert err <= tol, err


def _states_close(a, b, tol):
    for x, y in zip(a, b, strict=True):
        _close(x, y, tol)


def _reference(q, k, v, ig, fg, state, **kw):
    return naive_recurrent_mlstm(*(x.double() for x in (q, k, v, ig, fg)), initial_state=state,
                                 output_final_state=True, **kw)


def _float32_tolerance(q, k, v, ig, fg, state, h_ref):
    """Twice the float32 recurrence's own error on these inputs, and at least 1e-5 (float32's
    round-off over a few blocks: 3.7e-6 measured at T = 17, where the recurrence's own was
    1.4e-6): where |n . q| is near its floor the division amplifies round-off, in every float32
    form alike (measured: 1.4e-5 of the largest output at T = 63, 4.8e-5 at T = 300)."""
    h32, _ = naive_recurrent_mlstm(*(x.float() for x in (q, k, v, ig, fg)),
                                   initial_state=tuple(x.float() for x in state), dtype=torch.float32)
    err = float((h32.double() - h_ref).abs().max() / h_ref.abs().max().clamp(min=1.0))
    return max(2 * err, 1e-5)


# the quick suite: 1, both sides of 64 and a long one
@pytest.mark.parametrize("T", cells([1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 300], quick=[1, 63, 65, 300]))
def test_chunked_equals_naive(T):
    """Every length around the blocks' edges (16, 32), K != V, initial and final state: float64
    to round-off, float32 as close as the float32 recurrence (_float32_tolerance)."""
    (q, k, v, ig, fg), state = _inputs(2, T, 3, 8, 16, seed=T)
    h_ref, final_ref = _reference(q, k, v, ig, fg, state)
    for block in (16, 32):
        h, final = chunk_mlstm_torch(q, k, v, ig, fg, initial_state=state, output_final_state=True,
                                     block_size=block)
        assert h.dtype == torch.float64 and [x.dtype for x in final] == [torch.float32] * 2 + [torch.float64]
        _close(h, h_ref, 1e-12)
        _states_close(final, final_ref, 1e-6)  # both float32
    h, final = chunk_mlstm_torch(*(x.float() for x in (q, k, v, ig, fg)), initial_state=state,
                                 output_final_state=True)
    _close(h, h_ref, _float32_tolerance(q, k, v, ig, fg, state, h_ref))
    _states_close(final, final_ref, 1e-5)


def test_query_key_heads_half_the_value_heads():
    """xLSTM-7B's head shapes (qk_dim_factor 0.5: K = V / 2), the state (B, H, K, V), through the
    dispatcher; and the empty initial state (m = -inf: the original xLSTM's parallel form,
    whose stabiliser has no 0 term) against the recurrence from it."""
    (q, k, v, ig, fg), state = _inputs(1, 150, 2, 16, 32, seed=11)
    h_ref, final_ref = _reference(q, k, v, ig, fg, state)
    with torch.no_grad():
        h, final = mlstm(q.float(), k.float(), v.float(), ig.float(), fg.float(), initial_state=state,
                         output_final_state=True)
    assert final[0].shape == (1, 2, 16, 32) and final[1].shape == (1, 2, 16) and final[2].shape == (1, 2)
    _close(h, h_ref, _float32_tolerance(q, k, v, ig, fg, state, h_ref))
    _states_close(final, final_ref, 1e-5)
    empty = st.empty_state(1, 2, 16, 32)
    h_ref, final_ref = _reference(q, k, v, ig, fg, empty)
    h, final = chunk_mlstm_torch(q, k, v, ig, fg, initial_state=empty, output_final_state=True)
    _close(h, h_ref, 1e-12)
    _states_close(final, final_ref, 1e-6)


def test_default_state_and_scale():
    """No initial state is the zero state with m = 0 (transformers' and the xlstm package's);
    scale and eps as given; T = 0."""
    (q, k, v, ig, fg), _ = _inputs(1, 40, 2, 8, 8, seed=1)
    h, final = chunk_mlstm_torch(q, k, v, ig, fg, scale=0.3, eps=1e-3)
    h_ref, _ = naive_recurrent_mlstm(q, k, v, ig, fg, scale=0.3, eps=1e-3)
    assert final is None
    _close(h, h_ref, 1e-12)
    h, (C, n, m) = chunk_mlstm_torch(*(x[:, :0] for x in (q, k, v, ig, fg)), output_final_state=True)
    assert h.shape == (1, 0, 2, 8) and not C.any() and not n.any() and not m.any()


@pytest.mark.parametrize("cuts", [(1,), (17,), (32, 33), (5, 100, 101, 250)])
def test_split_and_resumed_at_any_cut(cuts):
    """Calls that carry the final state (float32, as the contract returns it) give one call's
    outputs and final state wherever the cuts fall; the span stages run on the same pieces from
    the empty state, each piece's h from its entering state, and their summaries folded in any
    grouping give the same state."""
    (q, k, v, ig, fg), state = _inputs(1, 300, 2, 16, 16, seed=7)
    h_one, final_one = chunk_mlstm_torch(q, k, v, ig, fg, initial_state=state, output_final_state=True)
    edges = [0, *cuts, 300]
    carried, outs, parts = state, [], []
    for a, b in zip(edges, edges[1:], strict=False):
        piece = [x[:, a:b] for x in (q, k, v, ig, fg)]
        h, carried = chunk_mlstm_torch(*piece, initial_state=carried, output_final_state=True)
        carried = tuple(x.double() for x in carried)
        outs.append(h)
        parts.append(st.span_parts(*piece))
    _close(torch.cat(outs, 1), h_one, 1e-6)
    _states_close(carried, final_one, 1e-6)
    entering, outs = state, []
    for p in parts:
        outs.append(st.outputs(p, entering))
        entering = st.fold(entering, p.summary)
    _close(torch.cat(outs, 1), h_one, 1e-11)
    _states_close(entering, final_one, 1e-6)
    folded = st.fold(state, st.fold_summaries([st.fold_summaries([p.summary for p in parts[:1]]),
                                               st.fold_summaries([p.summary for p in parts[1:]])]))
    _states_close(folded, final_one, 1e-6)


def test_block_edge_cuts_and_later_rows_change_no_bit():
    """Calls cut at blocks' edges (spans of 64 here, so a span's edge too), each continued from
    the state the last one returned, give one call's outputs and state to the bit; and a row's
    output has the same bits whatever follows it in its call (score-variants batches haplotypes
    of several lengths, end-padded)."""
    (q, k, v, ig, fg), state = _inputs(2, 300, 2, 8, 16, seed=11, dtype=torch.float32)
    state = tuple(x.float() for x in state[:2]) + (state[2],)
    ig[0, 70, 1] = 14.0  # a row past WIDE above its block's entering stabiliser: explicit scores
    fg[0, 50:70, 1] = -15.0
    c = chunk_mod.BLOCK_SIZE
    h_one, final_one = chunk_mlstm_torch(q, k, v, ig, fg, initial_state=state, output_final_state=True)
    carried, outs = state, []
    for a, b in ((0, c), (c, 3 * c), (3 * c, 300)):
        h, carried = chunk_mlstm_torch(*(x[:, a:b] for x in (q, k, v, ig, fg)), initial_state=carried,
                                       output_final_state=True)
        outs.append(h)
    assert torch.equal(torch.cat(outs, 1), h_one)
    assert all(torch.equal(x, y) for x, y in zip(carried, final_one, strict=True))
    for t in (1, 71, 100, 129):
        h, _ = chunk_mlstm_torch(*(x[:, :t] for x in (q, k, v, ig, fg)), initial_state=state)
        assert torch.equal(h, h_one[:, :t]), t


def test_span_parts_continued_with_before():
    """A pass continued over several calls (before=): parts and summary count from the first
    call's start, so each call's h comes from the state entering the first; an empty span's
    summary is the identity."""
    (q, k, v, ig, fg), state = _inputs(2, 200, 2, 8, 8, seed=5)
    h_ref, final_ref = _reference(q, k, v, ig, fg, state)
    first = st.span_parts(*(x[:, :70] for x in (q, k, v, ig, fg)))
    second = st.span_parts(*(x[:, 70:] for x in (q, k, v, ig, fg)), before=first.summary)
    _close(torch.cat([st.outputs(first, state), st.outputs(second, state)], 1), h_ref, 1e-11)
    _states_close(st.fold(state, second.summary), final_ref, 1e-6)
    empty = st.span_parts(*(x[:, :0] for x in (q, k, v, ig, fg)))
    _states_close(st.fold(state, empty.summary), state, 0.0)
    assert torch.isinf(st.fold_summaries([empty.summary, empty.summary]).m).all()


def test_stabiliser_jumps_and_extreme_gates(monkeypatch):
    """Blocks whose stabiliser rises by more than chunk.WIDE within them (an input gate far above
    the state's: the explicit scores), forget gates of 0 and 1 (preactivations -1e30 and +inf),
    input gates of -1e30 (nothing written), and all of them across a span's edge (spans of 512
    here): no inf or NaN, the recurrence's outputs and state, in float64 and float32."""
    monkeypatch.setattr(chunk_mod, "SPAN", 512)
    T = 3 * chunk_mod.SPAN - 100
    (q, k, v, ig, fg), state = _inputs(1, T, 2, 8, 8, seed=3)
    ig[0, 40, 0] = 15.0  # after ...
    ig[0, 20:40, 0] = -15.0
    fg[0, 20:41, 0] = -15.0  # ... forget gates that emptied the state: a rise of ~300 in a block
    ig[0, 96:126, 1] = torch.linspace(-700.0, 700.0, 30, dtype=torch.float64)  # past float64's WIDE
    fg[0, 300, 0] = -1e30  # a forget gate of exactly 0
    fg[0, 600:700, 1] = float("inf")  # of exactly 1
    ig[0, 900:1000, :] = -1e30  # nothing written
    fg[0, chunk_mod.SPAN - 3:chunk_mod.SPAN + 3, :] = -30.0  # across a span's edge
    ig[0, chunk_mod.SPAN, :] = 14.0
    h_ref, final_ref = _reference(q, k, v, ig, fg, state)
    explicit = []
    wide_scores = chunk_mod._wide_scores
    monkeypatch.setattr(chunk_mod, "_wide_scores",
                        lambda *a: explicit.append(len(a[-1][0])) or wide_scores(*a))
    for dtype in (torch.float64, torch.float32):
        explicit.clear()
        h, final = chunk_mlstm_torch(*(x.to(dtype) for x in (q, k, v, ig, fg)), initial_state=state,
                                     output_final_state=True)
        assert sum(explicit) >= (1 if dtype == torch.float64 else 2)  # blocks that took the explicit path
        assert torch.isfinite(h).all() and all(torch.isfinite(x).all() for x in final)
        tol = 1e-10 if dtype == torch.float64 else _float32_tolerance(q, k, v, ig, fg, state, h_ref)
        _close(h, h_ref, tol)
        _states_close(final, final_ref, max(tol, 1e-6))


@pytest.mark.slow  # importing transformers' models takes 15-25 s on the shared 2-core VM
def test_transformers_native_kernels_agree():
    """transformers' own native mLSTM (models/xlstm, the kernels xLSTMForCausalLM runs on a CPU
    without the xlstm package): its step-by-step recurrence and its chunkwise form, on the same
    inputs, initial state and K != V (their kernels run it; their model's cache does not, see
    tests/fla_fixtures/make_xlstm_fixtures.py), match the float64 recurrence as closely as the
    float32 recurrence does (their layout (B, H, T, .), their m (B, H, 1))."""
    xlstm = pytest.importorskip("transformers.models.xlstm.modeling_xlstm")
    assert not xlstm.external_xlstm  # the native kernels, not the xlstm package's
    (q, k, v, ig, fg), state = _inputs(2, 128, 2, 8, 16, seed=9, dtype=torch.float32)
    h_ref, final_ref = _reference(q, k, v, ig, fg, state)

    def theirs(x):
        return x.transpose(1, 2).contiguous()

    C0, n0, m0 = (x.float() for x in state)
    kw = dict(c_initial=C0, n_initial=n0, m_initial=m0[..., None], return_last_states=True)
    for form in (xlstm.mlstm_recurrent_sequence_native,
                 lambda *a, **k: xlstm.mlstm_chunkwise_native_autograd(*a, chunk_size=32, **k)):
        h, (C, n, m) = form(*(theirs(x) for x in (q, k, v, ig, fg)), **kw)
        _close(theirs(h), h_ref, _float32_tolerance(q, k, v, ig, fg, state, h_ref))
        _states_close((C, n, m[..., 0]), final_ref, 1e-5)


def test_bad_inputs_are_refused():
    (q, k, v, ig, fg), _ = _inputs(1, 5, 2, 8, 8, seed=0)
    with pytest.raises(ValueError, match="igate must have shape"):
        chunk_mlstm_torch(q, k, v, ig[..., 0], fg)
    with pytest.raises(ValueError, match=r"v \(B, T, H, V\)"):
        chunk_mlstm_torch(q, k, v[:, :4], ig, fg)
    with pytest.raises(NotImplementedError, match="no backward"):
        chunk_mlstm_torch(q.requires_grad_(), k, v, ig, fg)


@pytest.mark.slow
def test_a_million_positions_in_calls():
    """1,000,000 positions in 8 float32 calls carrying the state equal one float64 call of the
    chunked form (itself the recurrence to round-off, above) at every position: measured 1.6e-5
    of the largest output at the worst of the million (3e-6 for one float32 call, whose blocks
    fall elsewhere; the error is where n . q nearly cancels, and moves with the rounding). q and
    k share a positive direction here, so that n . q keeps away from 0 mostly
    (test_chunked_equals_naive has the general case against the float32 recurrence)."""
    T, calls = 1_000_000, 8
    # two heads of 16 (one head, or heads of 8, measured worst errors of 2e-5 to 9e-5 over seeds:
    # the cancellations get rarer but deeper); the inputs drawn in float32 (float64 draws took a
    # third of the time), the state in float64 as _inputs makes it
    _, state = _inputs(1, 1, 2, 16, 16, seed=13)
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, T, 2, 16, generator=g) for _ in range(3))
    ig = 15 * torch.tanh(torch.randn(1, T, 2, generator=g) * 3.0 / 15)
    fg = 15 * torch.tanh((torch.randn(1, T, 2, generator=g) * 2 + 3) / 15)
    q, k = q + 1.0, k + 1.0
    with torch.no_grad():
        h_ref, final_ref = chunk_mlstm_torch(*(x.double() for x in (q, k, v, ig, fg)), initial_state=state,
                                             output_final_state=True)
        carried, outs = state, []
        for a in range(0, T, T // calls):
            b = a + T // calls
            h, carried = chunk_mlstm_torch(q[:, a:b], k[:, a:b], v[:, a:b], ig[:, a:b], fg[:, a:b],
                                           initial_state=carried, output_final_state=True)
            outs.append(h)
    _close(torch.cat(outs, 1), h_ref, 5e-5)
    _states_close(carried, final_ref, 1e-5)


def _xlstm_logprobs(folder, seq):
    """A float64 forward of a transformers xLSTMForCausalLM checkpoint (tests/data/fla/xlstm*,
    read from its safetensors) through the chunked form: (logprob (T,), entropy (T,)) of seq's
    tokens after BOS. The layer as transformers' modeling_xlstm.py computes it (weight_mode
    "single"): RMSNorm, q/k/v/output-gate projections, input and forget gates soft-capped at
    gate_soft_cap, the mLSTM from the zero state (m = 0), a per-head layer norm, the sigmoid output
    gate, out_proj and the residual; RMSNorm, a SwiGLU FFN and the residual; the final RMSNorm,
    the head and the logits soft-capped at output_logit_soft_cap."""
    import json

    from make_fla_fixtures import BOS, token_ids
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    P = {k: v.double() for k, v in load_file(folder / "model.safetensors").items()}
    H, eps, cap = cfg["num_heads"], cfg["norm_eps"], cfg["gate_soft_cap"]

    def lin(x, name):
        y = x @ P[name + ".weight"].T
        return y + P[name + ".bias"] if name + ".bias" in P else y

    def rms(x, name):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * P[name + ".weight"]
        return y + P[name + ".bias"] if name + ".bias" in P else y

    ids = torch.tensor([BOS] + token_ids(seq)[:-1])
    x = P["backbone.embeddings.weight"][ids][None]  # (1, T, D)
    T = x.shape[1]
    for layer in range(cfg["num_hidden_layers"]):
        p, m = f"backbone.blocks.{layer}.", f"backbone.blocks.{layer}.mlstm_layer."
        a = rms(x, p + "norm_mlstm")
        q, k, v = (lin(a, m + n).view(1, T, H, -1) for n in ("q", "k", "v"))
        ig, fg = (cap * torch.tanh(lin(a, m + n) / cap) for n in ("igate_preact", "fgate_preact"))
        with torch.no_grad():
            h, _ = chunk_mlstm_torch(q, k, v, ig, fg, eps=cfg["eps"])  # (1, T, H, V)
        h = (h - h.mean(-1, keepdim=True)) * torch.rsqrt(h.var(-1, keepdim=True, unbiased=False) + eps)
        h = h.reshape(1, T, -1) * P[m + "multihead_norm.weight"] + P.get(m + "multihead_norm.bias", 0.0)
        x = x + lin(torch.sigmoid(lin(a, m + "ogate_preact")) * h, m + "out_proj")
        a = rms(x, p + "norm_ffn")
        x = x + lin(torch.nn.functional.silu(lin(a, p + "ffn.proj_up_gate")) * lin(a, p + "ffn.proj_up"),
                    p + "ffn.proj_down")
    logits = lin(rms(x, "backbone.out_norm"), "lm_head")[0]
    logits = cfg["output_logit_soft_cap"] * torch.tanh(logits / cfg["output_logit_soft_cap"])
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, torch.tensor(token_ids(seq))[:, None])[:, 0]
    return lp, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("name", cells(["xlstm", "xlstm_qk_half", "xlstm_bias"], quick=["xlstm_qk_half"]))
def test_transformers_xlstm_fixtures(name):
    """The fixtures' expected predictions (transformers' xLSTMForCausalLM on the real records,
    its native kernels: tests/fla_fixtures/make_xlstm_fixtures.py) from the checkpoints' tensors
    through this kernel, to 2e-5 in logprob and entropy (measured: 8e-6), K != V included."""
    import sys
    from pathlib import Path

    import numpy as np
    from _pipeline_data import read_fasta

    data = Path(__file__).parent / "data" / "fla"
    sys.path.insert(0, str(Path(__file__).parent / "fla_fixtures"))  # the fixtures' token ids
    expected = np.load(data / name / "expected.npz")
    for rid, seq in read_fasta(data / "records.fa").items():
        lp, ent = _xlstm_logprobs(data / name, seq)
        assert float(np.abs(lp.numpy() - expected[f"{rid}/logprob"]).max()) < 2e-5
        assert float(np.abs(ent.numpy() - expected[f"{rid}/entropy"]).max()) < 2e-5


def test_span_stages_in_float32_over_strong_forgetting():
    """The span stages in float32 fold without overflow where a span forgets everything (its
    summed log forget gates near -3000) and where one writes nothing (input gates of -1e30): the
    pieces' h from their entering states and the folded state match the float64 recurrence."""
    (q, k, v, ig, fg), state = _inputs(1, 400, 2, 8, 8, seed=17)
    fg[0, 100:300] = -15.0  # 200 x logsigmoid(-15): a summed log forget gate of -3000
    ig[0, 320:360] = -1e30
    h_ref, final_ref = _reference(q, k, v, ig, fg, state)
    entering, outs = state, []
    for a, b in ((0, 90), (90, 310), (310, 365), (365, 400)):
        parts = st.span_parts(*(x[:, a:b].float() for x in (q, k, v, ig, fg)))
        assert parts.num.dtype == torch.float32 and torch.isfinite(parts.summary.C).all()
        outs.append(st.outputs(parts, entering))
        entering = st.fold(entering, parts.summary)
    _close(torch.cat(outs, 1), h_ref, _float32_tolerance(q, k, v, ig, fg, state, h_ref))
    _states_close(entering, final_ref, 1e-5)
