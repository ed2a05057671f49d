"""The model computes format v1 exactly, and chunking never changes its outputs."""
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

import linpipe
from linpipe.inputs.alphabet import tokenize
from linpipe.model import ModelConfig, ModelState, init_net, load_model, save_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------------------------
# The literal per-position recurrence of docs/model-format.md, in float64 numpy, read from the
# files on disk: an independent check of the torch model.
# --------------------------------------------------------------------------------------------
PHI = {"elu1": lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))),
       "relu": lambda x: np.maximum(x, 0), "identity": lambda x: x}


def _reference(directory, x):
    cfg = json.loads((directory / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(str(directory / "model.safetensors")).items()}
    D, L, H, W = cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["conv_width"]
    K = D // H
    phi = PHI[cfg["feature_map"]]
    erf = np.vectorize(math.erf)

    def rms(h, wt):
        return h / np.sqrt(np.mean(h * h) + cfg["norm_eps"]) * wt

    if cfg["modality"] == "dna":
        embeds = [w["embed.weight"][5]] + [w["embed.weight"][t] for t in x]
    else:
        xn = np.nan_to_num((x - np.array(cfg["mean"])) / np.array(cfg["std"]), nan=0.0)
        embeds = [w["bos"]] + [w["embed.weight"] @ r + w["embed.bias"] for r in xn]
    S = np.zeros((L, H, K, K))
    z = np.zeros((L, H, K))
    hist = [[] for _ in range(L)]  # a values per layer, for the convolution
    ys = []
    for h in embeds:
        for li in range(L):
            p = f"layers.{li}."
            a = rms(h, w[p + "attn_norm.weight"])
            hist[li].append(a)
            if W > 1:
                cw = w[p + "attn.conv.weight"]
                j = len(hist[li]) - 1
                c = sum(cw[:, m] * hist[li][j - W + 1 + m] for m in range(W) if j - W + 1 + m >= 0)
            else:
                c = a
            q = phi(w[p + "attn.q_proj.weight"] @ c).reshape(H, K)
            k = phi(w[p + "attn.k_proj.weight"] @ c).reshape(H, K)
            v = (w[p + "attn.v_proj.weight"] @ c).reshape(H, K)
            o = np.zeros((H, K))
            for hh in range(H):
                g = w[p + "attn.decay"][hh]
                S[li, hh] = g * S[li, hh] + np.outer(k[hh], v[hh])
                z[li, hh] = g * z[li, hh] + k[hh]
                num = q[hh] @ S[li, hh]
                o[hh] = num / (q[hh] @ z[li, hh] + cfg["attn_eps"]) if cfg["normalize"] else num
            h = h + w[p + "attn.o_proj.weight"] @ o.reshape(D)
            m = rms(h, w[p + "mlp_norm.weight"])
            f = w[p + "mlp.fc1.weight"] @ m
            h = h + w[p + "mlp.fc2.weight"] @ (0.5 * f * (1 + erf(f / math.sqrt(2))))
        ys.append(rms(h, w["norm.weight"]))
    ys = np.array(ys)  # (N+1, D)
    logits = ys[:-1] @ w["head.weight"].T + w["head.bias"]  # prediction of x_i from y_{i}
    if cfg["modality"] == "dna":
        logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
            - logits.max(1, keepdims=True)
        lp = np.array([logp[i, t] if t < 4 else np.nan for i, t in enumerate(x)])
        ent = -(np.exp(logp) * logp).sum(1)
        return {"logprob": lp, "entropy": ent, "logprob_acgt": logp[:, :4], "hidden": ys[1:]}
    fc = logits * np.array(cfg["std"]) + np.array(cfg["mean"])
    return {"forecast": fc, "residual": x - fc, "hidden": ys[1:]}


def _dna_model(tmp_path, **kw):
    cfg = dict(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=48, conv_width=3)
    cfg.update({k: v for k, v in kw.items() if k not in ("decay", "seed")})
    config = ModelConfig(**cfg)
    save_model(init_net(config, seed=kw.get("seed", 0), decay=kw.get("decay")), config, tmp_path)
    return load_model(tmp_path)


def _ts_model(tmp_path, **kw):
    cfg = dict(modality="timeseries", d_model=32, n_layers=2, n_heads=4, mlp_hidden=40, conv_width=4,
               channels=2, channel_names=("MLII_mV", "V5_mV"), mean=(-0.3, -0.1), std=(0.2, 0.15))
    cfg.update(kw)
    config = ModelConfig(**cfg)
    save_model(init_net(config, seed=1, decay=[1.0, 0.999, 0.99, 0.9]), config, tmp_path)
    return load_model(tmp_path)


def _genome_slice(genomes, start, n):
    """Tokens from the human slice (soft-masked, with an N run at 177417) read with plain Python."""
    import gzip

    with gzip.open(genomes / "korflab_hg19_chr1_first3Mb.fa.gz", "rt") as f:
        f.readline()
        seq = []
        got = 0
        for line in f:
            seq.append(line.strip())
            got += len(seq[-1])
            if got >= start + n:
                break
    return tokenize("".join(seq)[start:start + n])


def _assert_outputs_close(got, want, rel):
    assert got.keys() == want.keys()
    for k in want:
        a, b = np.asarray(got[k], np.float64), np.asarray(want[k], np.float64)
        assert a.shape == b.shape, k
        assert np.array_equal(np.isnan(a), np.isnan(b)), k
        scale = max(np.nanmax(np.abs(b)), 1e-30) if b.size else 1
        err = np.nanmax(np.abs(a - b)) / scale if b.size else 0.0
        assert err < rel, (k, err)


def _assert_same(got, want):
    """The same bytes: a record's outputs do not depend on its batch (docs/pipeline.md)."""
    assert got.keys() == want.keys()
    for k in want:
        assert np.array_equal(np.asarray(got[k]), np.asarray(want[k]), equal_nan=True), k


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [
    dict(),
    dict(conv_width=1, feature_map="relu", normalize=False),
    dict(feature_map="identity", decay=0.9, n_layers=1),
    dict(decay=1.0, seed=5),
])
def test_dna_matches_literal_recurrence(tmp_path, genomes, variant):
    model = _dna_model(tmp_path, **variant)
    x = _genome_slice(genomes, 177417 - 40, 70)  # real bases running into an N run
    assert (x == 4).any() and (x < 4).any()
    out, _ = model.forward(x, model.init_state())
    _assert_outputs_close(out, _reference(tmp_path, x), 2e-5)
    assert np.isnan(out["logprob"][x == 4]).all() and np.isfinite(out["logprob"][x < 4]).all()


def test_timeseries_matches_literal_recurrence(tmp_path, timeseries):
    import pyarrow.parquet as pq

    table = pq.read_table(timeseries / "mitdb_100_ecg.parquet", columns=["MLII_mV", "V5_mV"])
    x = np.stack([table.column(c).to_numpy()[:60] for c in ("MLII_mV", "V5_mV")], 1).astype(np.float32)
    x[7, 1] = np.nan  # a gap in one channel
    model = _ts_model(tmp_path)
    out, _ = model.forward(x, model.init_state())
    _assert_outputs_close(out, _reference(tmp_path, x.astype(np.float64)), 2e-5)
    assert np.isnan(out["residual"][7, 1]) and np.isfinite(np.delete(out["residual"].ravel(), 15)).all()
    assert np.isfinite(out["forecast"]).all()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 700), max_size=6), modality=st.sampled_from(["dna", "timeseries"]))
def test_chunking_never_changes_outputs(tmp_path_factory, genomes, cuts, modality):
    """Random cut points, state carried across them, equal one pass within 1e-6 of each output's
    largest value (docs/pipeline.md, "Guarantees")."""
    model = _cached_models(tmp_path_factory)[modality]
    if modality == "dna":
        x = _cached_dna(genomes)
    else:
        x = np.cumsum(np.random.default_rng(0).normal(size=(700, 2)), 0).astype(np.float32) * 0.05
        x[100:103, 0] = np.nan
    whole, final = model.forward(x, model.init_state())
    state, parts = model.init_state(), []
    for a, b in zip([0] + sorted(cuts), sorted(cuts) + [len(x)], strict=False):
        out, state = model.forward(x[a:b], state)
        parts.append(out)
    pieced = {k: np.concatenate([p[k] for p in parts]) for k in whole}
    _assert_outputs_close(pieced, whole, 1e-6)
    _assert_outputs_close(state.to_arrays(), final.to_arrays(), 1e-6)


def test_pieces_shorter_than_the_conv_window(tmp_path_factory, genomes):
    """Pieces of 1, 2 and 3 positions (shorter than the conv window, W-1 = 3) carry the window
    exactly: equal one pass."""
    model = _cached_models(tmp_path_factory)["dna"]
    x = _cached_dna(genomes)[:40]
    whole, final = model.forward(x, model.init_state())
    cuts = [0, 1, 3, 6, 7, 9, 12, 40]
    state, parts = model.init_state(), []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        out, state = model.forward(x[a:b], state)
        parts.append(out)
    pieced = {k: np.concatenate([p[k] for p in parts]) for k in whole}
    _assert_outputs_close(pieced, whole, 1e-6)
    _assert_outputs_close(state.to_arrays(), final.to_arrays(), 1e-6)


_MODELS = {}


def _cached_models(factory):
    if not _MODELS:
        _MODELS["dna"] = _dna_model(factory.mktemp("dna"), decay=[1.0, 0.95])
        _MODELS["timeseries"] = _ts_model(factory.mktemp("ts"))
    return _MODELS


def _cached_dna(genomes, _cache=None):
    if _cache is None:
        _cache = {}
    if "x" not in _cache:
        _cache["x"] = _genome_slice(genomes, 177417 - 300, 700)
    return _cache["x"]


def test_state_arrays_round_trip_and_resume(tmp_path, genomes):
    model = _dna_model(tmp_path)
    x = _genome_slice(genomes, 20000, 500)
    whole, _ = model.forward(x, model.init_state())
    _, mid = model.forward(x[:200], model.init_state())
    arrays = mid.to_arrays()
    c = model.config
    assert {k: v.shape for k, v in arrays.items()} == {
        "S": (c.n_layers, c.n_heads, c.d_model // c.n_heads, c.d_model // c.n_heads),
        "z": (c.n_layers, c.n_heads, c.d_model // c.n_heads),
        "y": (c.d_model,), "conv": (c.n_layers, c.conv_width - 1, c.d_model)}
    assert all(v.dtype == np.float32 for v in arrays.values())
    rest, _ = model.forward(x[200:], ModelState.from_arrays(arrays))
    rest_in_memory, _ = model.forward(x[200:], mid)
    for k in whole:  # resuming from saved arrays is bit-identical to carrying the state
        np.testing.assert_array_equal(rest[k], rest_in_memory[k])
    _assert_outputs_close(rest, {k: v[200:] for k, v in whole.items()}, 1e-6)


def test_outputs_subset_and_unknown(tmp_path, genomes):
    model = _dna_model(tmp_path)
    x = _genome_slice(genomes, 20000, 300)
    full, _ = model.forward(x, model.init_state())
    only, _ = model.forward(x, model.init_state(), outputs=["entropy"])
    assert list(only) == ["entropy"]
    np.testing.assert_array_equal(only["entropy"], full["entropy"])
    with pytest.raises(linpipe.errors.ModelError, match="unknown output 'forecast'"):
        model.forward(x, model.init_state(), outputs=["forecast"])
    with pytest.raises(linpipe.errors.ModelError, match="tokens must be"):
        model.forward(np.array([0, 5], np.uint8), model.init_state())
    # batched records are checked on the padded batch, with the same error
    with pytest.raises(linpipe.errors.ModelError, match=r"tokens must be 0\.\.4 \(A C G T N\), got 7"):
        model.forward_records([x[:10], np.array([0, 7, 1], np.uint8)])
    with pytest.raises(linpipe.errors.ModelError, match="tokens must be"):
        model.forward_batch([x[:3], np.array([9], np.uint8)], [model.init_state()] * 2)
    with pytest.raises(linpipe.errors.ModelError, match="1-d token array"):
        model.forward_records([x[:10], x[:4].reshape(2, 2)])


def test_forward_records_equals_one_by_one(tmp_path, genomes):
    model = _dna_model(tmp_path, decay=[0.99, 1.0])
    x = _genome_slice(genomes, 100000, 3000)
    records = [x[:1], x[10:400], x[500:2900], x[2900:2900], x[1000:1033]]
    batched = model.forward_records(records, max_batch_positions=1000)  # forces several batches
    for rec, got in zip(records, batched, strict=False):
        want, _ = model.forward(rec, model.init_state())
        _assert_same(got, want)


def test_init_outputs_finite_and_varied(tmp_path, genomes):
    """A fresh `model init` model: no NaN/inf, predictions that differ between positions."""
    model = _dna_model(tmp_path, d_model=64, n_layers=4, n_heads=4, mlp_hidden=256, conv_width=4)
    x = _genome_slice(genomes, 1_000_000, 4000)
    out, state = model.forward(x, model.init_state())
    ok = x < 4
    assert np.isfinite(out["logprob"][ok]).all() and np.isfinite(out["entropy"]).all()
    assert np.isfinite(out["hidden"]).all()
    assert np.std(out["logprob"][ok]) > 0.05 and np.std(out["entropy"]) > 0.01
    assert 0 < out["entropy"].min() and out["entropy"].max() <= math.log(4) + 1e-5
    assert all(np.isfinite(v).all() for v in state.to_arrays().values())


def test_training_path_is_differentiable_and_consistent(tmp_path, genomes):
    """net.predict (the training path) gives the inference outputs, and gradients flow."""
    import torch

    model = _dna_model(tmp_path)
    x = _genome_slice(genomes, 300000, 256)
    net = init_net(model.config, seed=0)
    net.load_state_dict(model.net.state_dict())
    xt = torch.from_numpy(x.astype(np.int64)).view(2, 128)
    state = net.initial_state(2)
    pred, y, state = net.predict(xt, state)
    assert pred.shape == (2, 128, 4) and y.shape == (2, 128, 32)
    loss = torch.nn.functional.cross_entropy(pred.reshape(-1, 4), xt.reshape(-1).clamp(max=3))
    loss.backward()
    assert net.layers[0].attn.q_proj.weight.grad.abs().sum() > 0
    assert net.embed.weight.grad.abs().sum() > 0
    inf, _ = model.forward(x[:128], model.init_state())
    logp = torch.log_softmax(pred[0].detach(), -1).gather(-1, xt[0].clamp(max=3)[:, None])[:, 0].numpy()
    np.testing.assert_allclose(logp[x[:128] < 4], inf["logprob"][x[:128] < 4], rtol=1e-5, atol=1e-5)
    assert state.detach().arrays["S"].requires_grad is False


def test_default_model_loads_and_runs(genomes):
    model = linpipe.load_model("default")
    assert model.modality == "dna" and len(model.sha256) == 64
    x = _genome_slice(genomes, 50000, 1000)
    out, state = model.forward(x, model.init_state())
    assert out["hidden"].shape == (1000, model.config.d_model)
    assert np.isfinite(out["logprob"]).all()


def test_inference_leaves_weights_and_inputs_untouched(tmp_path, genomes):
    """CPU inference updates the residual stream in place: it must never reach the weights
    (initial_state starts from a view of embed.weight) or a caller's state."""
    model = _dna_model(tmp_path)
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    state = model.init_state()
    kept = state.to_arrays()
    x = _genome_slice(genomes, 300000, 300)
    a, _ = model.forward(x, state)
    b, _ = model.forward(x, model.init_state())
    for k, v in model.net.state_dict().items():
        assert torch.equal(v, before[k]), k
    for k, v in state.to_arrays().items():
        assert np.array_equal(v, kept[k]), k
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), k


def test_big_batched_calls_match_the_buffered_path(tmp_path, genomes):
    """forward_records batches many positions per call, beyond what CPU inference keeps in
    reused buffers (INFER_BUFFERED): that allocating path gives the streamed outputs."""
    from linpipe.model import blocks as model_mod

    model = _dna_model(tmp_path)
    n = model_mod.INFER_BUFFERED // 2 + 100
    xs = [_genome_slice(genomes, 400000 + 7 * n * i, n) for i in range(3)]  # 3 x n > INFER_BUFFERED
    batched = model.forward_records(xs)
    for x, got in zip(xs, batched, strict=False):
        want, _ = model.forward(x, model.init_state())
        _assert_same(got, want)


def test_forward_batch_continues_each_state(tmp_path, genomes):
    """forward_batch: chunks of different lengths, each read after its own state, in one
    end-padded call, give what forward gives continuing from that state (the first position's
    prediction comes from the state's y)."""
    model = _dna_model(tmp_path, decay=[0.95, 1.0])
    x = _genome_slice(genomes, 177417 - 600, 900)  # into the N run at 600
    cuts = [(0, 300), (100, 101), (450, 900)]
    states = [model.forward(x[:a], model.init_state())[1] for a, _ in cuts]
    got = model.forward_batch([x[a:b] for a, b in cuts], states)
    for (a, b), state, g in zip(cuts, states, got, strict=True):
        want, _ = model.forward(x[a:b], state)
        _assert_same(g, want)
        assert g["logprob"].shape == (b - a,)


def test_forward_batch_of_per_channel_models(genomes, timeseries):
    """A series_norm model reads every channel as a lane with its carried norm: forward_batch
    from two-channel states equals forward continuing from them."""
    import pyarrow.parquet as pq

    model = load_model("default-timeseries")
    t = pq.read_table(timeseries / "mitdb_100_ecg.parquet")
    x = np.stack([t.column(c).to_numpy()[:3000] for c in ("MLII_mV", "V5_mV")], 1)
    states = [model.forward(x[:a], model.init_state())[1] for a in (1000, 2200)]
    chunks = [x[1000:1800], x[2200:2300]]
    got = model.forward_batch(chunks, states)
    for c, state, g in zip(chunks, states, got, strict=True):
        want, _ = model.forward(c, state)
        assert g.keys() == want.keys() and "hidden" not in g  # per channel: not with two
        _assert_same(g, want)
