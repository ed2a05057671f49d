"""The delta-rule layer kinds (config family `delta_net`, `gated_deltanet`): fla 0.6's tensors and
their validation, `model init --family` and `model info`, the layer against a plain reference of
its formulas, every cut and batch of a real genome through the one forward core, and training."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _model_edits import DROP, edit_config
from _pipeline_data import make_tiny_model
from _quick import cells
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from linpipe.cli import cli
from linpipe.errors import ModelError
from linpipe.inputs.alphabet import tokenize
from linpipe.kernels.delta_rule import naive_recurrent_delta_rule
from linpipe.model import ModelConfig, init_net, load_model
from linpipe.model.families.fla_keys import key_dim, value_dim
from linpipe.training.loop import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# the models the layer tests run: each family, and gated_deltanet with grouped value heads (2
# query/key heads serving 4 value heads)
MODELS = {"delta_net": {}, "gated_deltanet": {}, "gated_deltanet_gva": dict(n_v_heads=4)}


@pytest.fixture(scope="module", params=MODELS)
def delta_dir(request, tmp_path_factory):
    family = request.param.removesuffix("_gva")
    return make_tiny_model(tmp_path_factory.mktemp("d") / request.param, family=family,
                           **MODELS[request.param])


@pytest.fixture(scope="module")
def mt(genomes):
    """Human mitochondrial DNA, tokens (16,569 bases)."""
    return tokenize("".join(line.strip() for line in open(genomes / "minimap2_MT-human.fa")
                            if not line.startswith(">")))


def test_init_writes_fla_tensors_and_info_shows_family_and_state(tmp_path):
    d = tmp_path / "gdn"
    res = CliRunner().invoke(cli, ["model", "init", str(d), "--family", "gated_deltanet", "--d-model", "32",
                                   "--n-heads", "2", "--head-dim", "8", "--mlp-hidden", "48"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["family"] == "gated_deltanet" and cfg["head_dim"] == 8 and cfg["expand_v"] == 2.0
    assert cfg["use_gate"] is True and "feature_map" not in cfg and "gate" not in cfg
    t = load_file(str(d / "model.safetensors"))
    # fla 0.6's GatedDeltaNet: key_dim = H*K = 16, value_dim = H*K*expand_v = 32
    want = {"attn.q_proj.weight": (16, 32), "attn.k_proj.weight": (16, 32), "attn.v_proj.weight": (32, 32),
            "attn.a_proj.weight": (2, 32), "attn.b_proj.weight": (2, 32), "attn.A_log": (2,),
            "attn.dt_bias": (2,), "attn.q_conv1d.weight": (16, 1, 4), "attn.k_conv1d.weight": (16, 1, 4),
            "attn.v_conv1d.weight": (32, 1, 4), "attn.g_proj.weight": (32, 32), "attn.o_norm.weight": (16,),
            "attn.o_proj.weight": (32, 32), "mlp.gate_proj.weight": (48, 32), "mlp.up_proj.weight": (48, 32),
            "mlp.down_proj.weight": (32, 48)}
    for name, shape in want.items():
        assert tuple(t[f"layers.1.{name}"].shape) == shape, name
    info = json.loads(CliRunner().invoke(cli, ["model", "info", str(d), "--json"]).output)
    # per layer S (H, K, V) = 2*8*16 and the q, k, v windows 3 x (16 + 16 + 32), then y (D)
    assert info["family"] == "gated_deltanet"
    assert info["state_bytes_per_record"] == 4 * (2 * (2 * 8 * 16 + 3 * 64) + 32)
    text = CliRunner().invoke(cli, ["model", "info", str(d)]).output
    assert "family      gated_deltanet" in text and "bytes per record" in text
    dn = tmp_path / "dn"
    assert CliRunner().invoke(cli, ["model", "init", str(dn), "--family", "delta_net", "--d-model", "16",
                                    "--n-heads", "2", "--conv-width", "1"]).exit_code == 0
    c = load_model(dn).config
    assert (key_dim(c), value_dim(c), c.layer.use_gate, c.layer.use_short_conv) == (8, 8, False, False)
    assert not [k for k in load_file(str(dn / "model.safetensors")) if "conv1d" in k or "A_log" in k]


def test_grouped_value_heads_shapes_config_and_state(tmp_path):
    """n_v_heads 4 over 2 query/key heads: q, k (and their convs) per query/key head; v, b_proj,
    a_proj, A_log, dt_bias, g_proj and o_proj per value head; config.json's "n_v_heads" (absent
    without); the state S (L, HV, K, V) and the conv window 2HK + HV V wide, as model info says."""
    d = make_tiny_model(tmp_path / "gva", family="gated_deltanet", n_v_heads=4)
    t = load_file(str(Path(d) / "model.safetensors"))
    want = {"q_proj.weight": (32, 32), "k_proj.weight": (32, 32), "v_proj.weight": (128, 32),
            "q_conv1d.weight": (32, 1, 4), "v_conv1d.weight": (128, 1, 4), "b_proj.weight": (4, 32),
            "a_proj.weight": (4, 32), "A_log": (4,), "dt_bias": (4,), "g_proj.weight": (128, 32),
            "o_norm.weight": (32,), "o_proj.weight": (32, 128)}
    for name, shape in want.items():
        assert tuple(t[f"layers.0.attn.{name}"].shape) == shape, name
    assert json.loads((Path(d) / "config.json").read_text())["n_v_heads"] == 4
    plain = make_tiny_model(tmp_path / "gdn", family="gated_deltanet")
    assert "n_v_heads" not in json.loads((Path(plain) / "config.json").read_text())
    m = load_model(d)
    shapes = m.config.state_shapes()
    assert shapes["S"] == (2, 4, 16, 32) and shapes["conv"][-1] == 2 * 32 + 128
    assert m.init_state().arrays["S"].shape == (1, 2, 4, 16, 32)
    info = json.loads(CliRunner().invoke(cli, ["model", "info", d, "--json"]).output)
    assert info["state_bytes_per_record"] == 4 * (2 * (4 * 16 * 32 + 3 * (2 * 32 + 128)) + 32)
    assert info["config"]["n_v_heads"] == 4 and len(info["decay"]["layer 0"]) == 4


def test_save_load_round_trip_computes_the_same_bytes(delta_dir, mt, tmp_path):
    m = load_model(delta_dir)
    assert m.config.family != "linear_attn" and m.config == ModelConfig.from_json(m.config.to_json())
    again = tmp_path / "again"
    shutil.copytree(delta_dir, again)
    from linpipe.model import Model, save_model

    assert save_model(m.net, m.config, again) == m.sha256  # the same bytes on disk
    x = mt[:600]
    a = m.forward(x, m.init_state())[0]
    b = Model(init_net(m.config, seed=0), m.config).forward(x, m.init_state())[0]
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


def test_models_written_before_load_unchanged():
    """The shipped models are linear attention; their config.json is what to_json writes (no
    delta-rule keys), and a config without `family` is today's kind."""
    from linpipe.model.files import SHIPPED_MODELS

    for name in ("default", "default-timeseries"):
        m = load_model(name)
        assert m.config.family == "linear_attn" and "family" not in m.config.to_json()
        assert m.config.to_json() == json.loads((SHIPPED_MODELS / name / "config.json").read_text())


@pytest.mark.parametrize("change, message", [
    ({"family": "hyena"}, "unknown 'family' 'hyena'"),
    ({"head_dim": 2.5}, "'head_dim' must be an integer"),
    ({"head_dim": DROP}, "missing key 'head_dim'"),
    ({"expand_v": 0.3}, "'expand_v' 0.3 times head_dim 16 is not a positive integer"),
    ({"use_gate": "yes"}, "'use_gate' must be true or false"),
    ({"gate": {}}, "'gate' is for families 'linear_attn', 'gla', not 'gated_deltanet'"),
    ({"n_v_heads": 3}, "'n_v_heads' must be a positive multiple of n_heads 2, got 3"),
    ({"n_v_heads": 1}, "'n_v_heads' must be a positive multiple of n_heads 2, got 1"),
    ({"n_v_heads": 4.0}, "'n_v_heads' must be an integer"),
    ({"n_v_heads": 4, "family": "delta_net"},
     "'n_v_heads' is for families 'gated_deltanet', 'kda', not 'delta_net'"),
    ({"n_kv_heads": 1},
     "'n_kv_heads' is for families 'gla', 'retnet', 'fla_linear_attn', not 'gated_deltanet'"),
])
def test_bad_config_is_one_line(tmp_path, change, message):
    d = tmp_path / "m"
    make_tiny_model(d, family="gated_deltanet")
    edit_config(**change)(d)
    with pytest.raises(ModelError, match=message):
        load_model(d)
    res = CliRunner().invoke(cli, ["model", "info", str(d)])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and "config.json" in res.output
    assert message in res.output and res.output.count("\n") == 1


@pytest.mark.parametrize("case", ["missing A_log", "conv shape", "non-finite dt_bias", "linear-attn tensor"])
def test_bad_tensor_is_one_line(tmp_path, case):
    d = tmp_path / "m"
    make_tiny_model(d, family="gated_deltanet")
    t = load_file(str(d / "model.safetensors"))
    if case == "missing A_log":
        del t["layers.1.attn.A_log"]
        message = "missing tensor 'layers.1.attn.A_log'"
    elif case == "conv shape":
        t["layers.0.attn.k_conv1d.weight"] = torch.zeros(32, 4)
        message = "tensor 'layers.0.attn.k_conv1d.weight' has shape [32, 4], expected [32, 1, 4]"
    elif case == "non-finite dt_bias":
        t["layers.0.attn.dt_bias"][1] = float("nan")
        message = "tensor 'layers.0.attn.dt_bias' has non-finite values"
    else:
        t["layers.0.attn.decay"] = torch.ones(2)
        message = "unexpected tensor 'layers.0.attn.decay'"
    save_file(t, str(d / "model.safetensors"))
    res = CliRunner().invoke(cli, ["model", "info", str(d)])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and "model.safetensors" in res.output
    assert message in res.output and res.output.count("\n") == 1


def test_init_options_of_the_wrong_family_are_refused(tmp_path):
    for args, hint in ((["--family", "delta_net", "--gate"], "--gate"), (["--head-dim", "8"], "--head-dim"),
                       (["--family", "gated_deltanet", "--decay", "0.9"], "--decay")):
        res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), *args])
        assert res.exit_code != 0 and hint in res.output and not (tmp_path / "m").exists()


def _reference_layer(layer, c, a):
    """One delta-rule layer's attention branch, h -> o_proj(...), written from fla's formulas with
    plain torch ops (F.conv1d, the float64 recurrence), on a (1, T, D)."""
    at = layer.attn
    H, HV, K, V = c.n_heads, c.spec.v_heads(c), key_dim(c), value_dim(c)
    T = a.shape[1]

    def conv(x, module):  # depthwise causal: pad W-1 on the left
        w = module.weight  # (C, 1, W)
        return F.conv1d(F.pad(x.transpose(1, 2), (w.shape[-1] - 1, 0)), w, groups=w.shape[0]).transpose(1, 2)

    q = F.silu(conv(at.q_proj(a), at.q_conv1d)).view(1, T, H, K)
    k = F.silu(conv(at.k_proj(a), at.k_conv1d)).view(1, T, H, K)
    v = F.silu(conv(at.v_proj(a), at.v_conv1d)).view(1, T, HV, V)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    qk_head = torch.arange(HV) // (HV // H)  # fla's GVA: value head j reads q/k head j // G
    q, k = q[:, :, qk_head], k[:, :, qk_head]
    beta = torch.sigmoid(at.b_proj(a))
    g = -torch.exp(at.A_log) * F.softplus(at.a_proj(a) + at.dt_bias) if c.family == "gated_deltanet" else None
    o, _ = naive_recurrent_delta_rule(q, k, v, beta, log_gate=g)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.norm_eps) * at.o_norm.weight
    if c.layer.use_gate:
        o = o * F.silu(at.g_proj(a).view(1, T, HV, V))
    return at.o_proj(o.reshape(1, T, HV * V))


def test_layer_computes_flas_formulas(delta_dir, mt):
    """The layer (fused projections, row tiles, the carried-window convolution) against its formulas
    written plainly: the same to float32 round-off."""
    m = load_model(delta_dir)
    c, layer = m.config, m.net.layers[0]
    with torch.no_grad():
        a = layer.attn_norm(m.net.embed_inputs(torch.from_numpy(mt[None, :300].astype(np.int64))))
        S0 = torch.zeros((1, *c.state_shapes()["S"][1:]))
        window = torch.zeros((1, *c.state_shapes()["conv"][1:]))
        o, after = layer.attn(a, {"S": S0, "conv": window})
        S = after["S"]
        got = F.linear(o, layer.attn.o_proj.weight)
        want = _reference_layer(layer, c, a)
    assert S.shape == S0.shape and bool((S != 0).any())
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


# the two byte guarantees below run one family each in the quick suite, both in the full suite
@pytest.mark.parametrize("delta_dir", cells(list(MODELS), quick=["delta_net"]), indirect=True, scope="module")
def test_cuts_and_batches_give_the_same_bytes(delta_dir, mt):
    """A real record in one call, or cut at multiples of the model's exact cut (512: whole groups
    of the kernel's blocks) with the state (the recurrent S and the q, k, v convolutions' windows)
    carried: the same outputs and final state, bit for bit; cut at odd places: within 1e-6 of
    the largest magnitude (docs/pipeline.md, "Guarantees"); and a record batched with others
    (packed records, runs of positions from states) as alone."""
    m = load_model(delta_dir)
    x = mt[:2500]
    whole, end = m.forward(x, m.init_state())
    assert m.exact_cut == 512
    for cuts, exact in (((512, 1024, 2048), True), ((1, 2, 3, 700, 2047), False), ((999,), False)):
        state, parts = m.init_state(), []
        for a, b in zip((0, *cuts), (*cuts, len(x)), strict=True):
            out, state = m.forward(x[a:b], state)
            parts.append(out)
        got_state = state.to_arrays()
        assert sorted(got_state) == ["S", "conv", "y"]  # no z: the delta rule has no normaliser
        pairs = [(np.concatenate([p[k] for p in parts]), want, k) for k, want in whole.items()]
        pairs += [(got_state[k], v, k) for k, v in end.to_arrays().items()]
        for got, want, k in pairs:
            if exact:
                assert got.tobytes() == want.tobytes(), (cuts, k)
            else:
                scale = float(np.nanmax(np.abs(want)))
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * scale, err_msg=f"{cuts} {k}")
    lengths = (1, 17, 300, 2500)
    for r, n in zip(m.forward_records([x[:n] for n in lengths]), lengths, strict=True):
        for k in whole:
            assert r[k].tobytes() == whole[k][:n].tobytes(), (n, k)
    _, st = m.forward(x[:1111], m.init_state())
    runs = [x[1111:1200], x[1111:1112], mt[5000:5100]]
    for run, got in zip(runs, m.forward_batch(runs, [st, st, st]), strict=True):
        alone = m.forward(run, st)[0]
        for k in alone:
            assert got[k].tobytes() == alone[k].tobytes(), k


@pytest.mark.parametrize("delta_dir", cells(list(MODELS), quick=["gated_deltanet"]), indirect=True,
                         scope="module")
def test_thread_count_gives_the_same_bytes(delta_dir, mt):
    m = load_model(delta_dir)
    x = mt[3000:4500]
    one = m.forward(x, m.init_state())
    torch.set_num_threads(2)
    try:
        two = m.forward(x, m.init_state())
    finally:
        torch.set_num_threads(1)
    for k in one[0]:
        assert one[0][k].tobytes() == two[0][k].tobytes(), k
    for k, v in one[1].to_arrays().items():
        assert v.tobytes() == two[1].to_arrays()[k].tobytes(), k


def test_state_arrays_round_trip(delta_dir, mt):
    from linpipe.model import ModelState

    m = load_model(delta_dir)
    _, st = m.forward(mt[:100], m.init_state())
    back = ModelState.from_arrays(st.to_arrays())
    a, _ = m.forward(mt[100:300], st)
    b, _ = m.forward(mt[100:300], back)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    bad = {**st.to_arrays(), "z": np.zeros((2, 2, 16), np.float32)}  # a linear-attention state
    with pytest.raises(ModelError, match="model state 'z': this model's state has no such array"):
        m.forward(mt[:10], ModelState.from_arrays(bad))


TINY = dict(d_model=16, n_layers=1, n_heads=2, mlp_hidden=32, conv_width=4, family="gated_deltanet",
            head_dim=8, expand_v=2.0, use_gate=True)
CFG = TrainConfig(steps=30, batch=4, window=32, lr=1e-2, warmup=5, checkpoint_every=100)


@pytest.mark.slow
def test_train_gated_deltanet_loss_falls(genomes, tmp_path):
    """A tiny gated DeltaNet on human mitochondrial DNA: the loss falls, and every delta-rule
    parameter (the gate's A_log and dt_bias among them) was trained."""
    full = train([genomes / "minimap2_MT-human.fa"], tmp_path / "m", TINY, CFG)
    losses = np.asarray(full.losses)
    assert np.isfinite(losses).all() and losses[:8].mean() - losses[-8:].mean() > 0.05
    trained, start = load_model(tmp_path / "m"), init_net(ModelConfig(modality="dna", **TINY), seed=0)
    assert trained.config.family == "gated_deltanet"
    after, before = trained.net.state_dict(), start.state_dict()
    for name in ("A_log", "dt_bias", "a_proj.weight", "b_proj.weight", "q_conv1d.weight", "g_proj.weight",
                 "o_norm.weight"):
        moved = float((after[f"layers.0.attn.{name}"] - before[f"layers.0.attn.{name}"]).abs().max())
        assert moved > 1e-4 and math.isfinite(moved), name


def test_cli_train_family(genomes, tmp_path):
    out = tmp_path / "m"
    r = CliRunner().invoke(cli, ["train", str(genomes / "minimap2_MT-human.fa"), "--out", str(out),
                                 "--family", "delta_net", "--d-model", "16", "--n-layers", "1", "--n-heads",
                                 "2", "--steps", "3", "--batch", "2", "--window", "32", "--quiet"])
    assert r.exit_code == 0, r.output
    c = load_model(out).config
    assert c.family == "delta_net" and not c.layer.use_gate and key_dim(c) == 8


@pytest.mark.slow
def test_train_resumes_exactly(genomes, tmp_path):
    """Stopped at a checkpoint (the lanes' states: S and the q, k, v windows) and resumed: the
    losses of an uninterrupted run."""
    mt = genomes / "minimap2_MT-human.fa"
    cfg = TrainConfig(steps=12, batch=2, window=32, lr=1e-2, warmup=2, checkpoint_every=6)
    full = train([mt], tmp_path / "full", TINY, cfg)
    assert train([mt], tmp_path / "resumed", TINY, cfg, stop_at=6) is None
    res = train([mt], tmp_path / "resumed", TINY, cfg, resume=True)
    np.testing.assert_allclose(res.losses, full.losses, rtol=1e-6, atol=0)
